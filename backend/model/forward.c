/*
 * forward.c -- the forward pass of sessions on the CPU: decode (one batched
 * step over any number of sessions; kvs_session_decode is the batch of one),
 * prefill and kvs_session_extend.
 *
 * Prefill runs the prompt (longer than KVS_SHORT_PROMPT tokens; shorter ones
 * go token by token through the decode kernels) in chunks of up to KVS_UBATCH
 * tokens: a weight matrix on the block-scale route (kvs_dot_bs_route: Q8_0,
 * Q5_0, Q4_K, Q6_K where the CPU has AVX-512 VNNI or AMX) multiplies the
 * chunk's activations quantised to 8 bits (decode's kernels, all T columns at
 * once: 2.5x the tokens/s of sgemm at 512 on Qwen2.5 here); any other is
 * dequantised once per chunk into a scratch buffer and multiplied with
 * OpenBLAS sgemm; attention is tiled (KVS_QTILE
 * queries x the keys they may see, never N x N) with sgemm for scores and
 * outputs; the key/value rows of a tile are converted to fp32 into per-thread
 * scratch allocated once per prefill. Only the last position's logits are
 * computed. kvs_session_extend runs up to KVS_EXTEND_COLS tokens as one pass
 * of the decode kernels (a column per token) and longer ones as the same
 * chunks at n_past over a compressed cache (masks by each head's stored
 * positions). Decode multiplies quantised weight rows with activations
 * quantised to 8 bits (integer AVX2 dot products), rows split over the thread
 * pool, every sequence of a batch against each row while it is in cache; it
 * allocates nothing.
 * What it is not: no cache management (session.c), no sampling (server), no
 * method logic (methods/, core/).
 */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "session_internal.h"

/* ---- small math ------------------------------------------------------------- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = kvs_sumsq(x, n);
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}


static void rope_apply(float *v, int D, const float *cs, const float *sn, int neox) {
    int h = D / 2;
    if (neox) {
        for (int i = 0; i < h; i++) {
            float a = v[i], b = v[i + h];
            v[i] = a * cs[i] - b * sn[i];
            v[i + h] = a * sn[i] + b * cs[i];
        }
    } else {
        for (int i = 0; i < h; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * cs[i] - b * sn[i];
            v[2 * i + 1] = a * sn[i] + b * cs[i];
        }
    }
}

static void rope_table(const float *inv_freq, int half, int pos, float *cs, float *sn) {
    for (int i = 0; i < half; i++) {
        double a = (double)pos * inv_freq[i];
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
    }
}

/* ---- decode: parallel matrix-vector products over a batch ---------------------- */

/* Up to three matrices sharing the input; every sequence i of the batch:
 * out_w[i * ostride_w + r] = W_w[r] . x_i (+ b_w[r]). */
typedef struct {
    const kvs_wmat *w[3];
    float *out[3];
    int ostride[3];
    const float *bias[3];
    int nw, n;
    const float *xf; /* [n][xstride] fp32 activations (float weight types) */
    int xstride;
    const kvs_q8a_block *xq; /* [n][qstride] quantised activations */
    int qstride;
    int64_t total, chunk; /* rows of all nw matrices; rows per claim */
    atomic_llong next;    /* first row not yet claimed */
} mv_job;

/* Rows [r0, r1) of the concatenated matrices. */
static void mv_rows(const mv_job *j, int64_t r0, int64_t r1) {
    int64_t base = 0;
    for (int i = 0; i < j->nw; i++) {
        const kvs_wmat *w = j->w[i];
        int64_t a = r0 > base ? r0 - base : 0, b = r1 - base < w->rows ? r1 - base : w->rows;
        const uint8_t *data = w->data;
        int fl = w->type == KVS_GGML_F32 || w->type == KVS_GGML_F16 || w->type == KVS_GGML_BF16;
        float *out = j->out[i];
        const float *bias = j->bias[i];
        const int os = j->ostride[i];
        for (int64_t r = a; fl && r < b; r++) {
            const void *row = data + (size_t)r * w->row_bytes;
            float br = bias ? bias[r] : 0.0f;
            for (int s = 0; s < j->n; s++)
                out[(size_t)s * os + r] = kvs_dot_f32(w->type, row, j->xf + (size_t)s * j->xstride, w->cols) + br;
        }
        if (!fl && b > a) {
            /* each weight block unpacked once for every sequence (same result per column as alone) */
            kvs_dot_q8a_rows(w->type, data + (size_t)a * w->row_bytes, w->row_bytes, b - a, j->xq, j->qstride, j->n,
                             w->cols, out + a, os);
            if (bias)
                for (int s = 0; s < j->n; s++)
                    for (int64_t r = a; r < b; r++) out[(size_t)s * os + r] += bias[r];
        }
        base += w->rows;
    }
}

/* Threads claim chunks of rows until none are left: on a shared machine a
 * thread that runs late takes fewer rows instead of holding the others at
 * the join. Which thread computes a row does not change its result. */
static void mv_run(void *arg, int ith, int nth) {
    mv_job *j = arg;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t r0 = (int64_t)atomic_fetch_add_explicit(&j->next, (long long)j->chunk, memory_order_relaxed);
        if (r0 >= j->total) break;
        mv_rows(j, r0, r0 + j->chunk < j->total ? r0 + j->chunk : j->total);
    }
}

/* out_w = W_w x (+ b_w) for the n sequences of db, x [n][xstride]. */
static void matvec(kvs_pool *pool, dec_buf *db, int n, const float *x, int xstride, int nw, const kvs_wmat *w0,
                   float *o0, int s0, const float *b0, const kvs_wmat *w1, float *o1, int s1, const float *b1,
                   const kvs_wmat *w2, float *o2, int s2, const float *b2) {
    mv_job j = {{w0, w1, w2}, {o0, o1, o2}, {s0, s1, s2}, {b0, b1, b2}, nw, n, x, xstride, db->xq, db->nqb, 0, 0, 0};
    for (int i = 0; i < nw; i++) j.total += j.w[i]->rows;
    /* about 8 claims per thread (3 for a batch: every call of a many-column kernel first packs the
     * batch's activations, as costly as ~25 rows of 32 columns; with 8 claims the packing was about a
     * tenth of a 32-sequence Qwen2.5 step), whole 16-row blocks (the dot kernels' row block), at most
     * 1024 rows */
    int64_t c = j.total / ((int64_t)kvs_pool_size(pool) * (n > 1 ? 3 : 8));
    c = (c + 15) / 16 * 16;
    j.chunk = c < 16 ? 16 : c > 1024 ? 1024 : c;
    for (int i = 0; i < n; i++) kvs_q8a_quantize(x + (size_t)i * xstride, db->xq + (size_t)i * db->nqb, w0->cols);
    kvs_pool_run(pool, mv_run, &j);
}

/* ---- decode: attention over the ragged caches ------------------------------------ */

typedef struct {
    kvs_session *const *ss;
    const dec_buf *db;
    int l, n, window; /* window 0: global */
    int nsplit;       /* jobs per (sequence, KV head): its query heads in nsplit parts */
    float *sbuf;      /* NULL: scores in each session's own buffer; else [threads][G][sstride] */
    size_t sstride;
    atomic_int next;  /* first job not yet claimed */
    int phase;        /* -1: att_run's one pass; 0, 1, 2: att_split_run's phases */
} att_job;

/* The first row of KV head g of layer c (len rows) that a query at position
 * pos sees: 0, or in a sliding-window layer the first inside the window. */
static int att_first_row(const kv_layer *c, int g, int len, int pos, int window) {
    return window <= 0 ? 0 : kvs_kv_first_visible(kvs_kv_pos(c, g), len, pos, window);
}

/* Jobs are (sequence, KV head, part of its query heads): the heads of a job
 * go together over the group's key and value rows, so each f16/bf16 row is
 * converted once per pass of up to four heads, not once per head
 * (kvs_dot_cache_heads). Query i sees rows [0, lim[i]) of its session's layer
 * (those inside the window by position). Each head's arithmetic is that of
 * one head alone, whatever the parts and whichever thread claims the job. */
static void att_run(void *arg, int ith, int nth) {
    att_job *j = arg;
    (void)nth;
    const kvs_model_info *MI = &j->ss[0]->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, G = Hq / Hkv, ns = j->nsplit;
    const int njobs = j->n * Hkv * ns;
    for (;;) {
        int job = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (job >= njobs) break;
        int i = job / (Hkv * ns), g = job % (Hkv * ns) / ns, part = job % ns;
        int h0 = g * G + G * part / ns, nh = g * G + G * (part + 1) / ns - h0;
        const kvs_session *s = j->ss[i];
        const kv_layer *c = &s->kv[j->l];
        const int pos = j->db->pos[i], len = j->db->lim[i] - kvs_kv_lag(c, g);
        const int j0 = att_first_row(c, g, len, pos, j->window);
        /* head h0 + k's scores at sc + k * scs, indexed by row */
        float *sc = j->sbuf ? j->sbuf + (size_t)ith * G * j->sstride : s->scores + (size_t)h0 * s->n_ctx;
        const size_t scs = j->sbuf ? j->sstride : (size_t)s->n_ctx;
        const float *qh = j->db->q + ((size_t)i * Hq + h0) * D;
        float *o = j->db->att + ((size_t)i * Hq + h0) * D;
        if (c->kivi) { /* a KIVI store: its codes read directly (kivi_cache.c), one job per store */
            kvs_kv_kivi_attend(s, c, g, qh, nh, len, sc, o);
            continue;
        }
        kvs_dot_cache_heads(s->ctype_k, qh, D, nh, kvs_kv_krow(s, c, g, j0), D, len - j0, D, s->m->attn_scale,
                            sc + j0, scs);
        for (int k = 0; k < nh; k++) {
            float *r = sc + k * scs;
            const float mx = kvs_vmax(r + j0, len - j0);
            double sum = kvs_vexp_sub(r + j0, len - j0, mx);
            float inv = (float)(1.0 / sum);
            kvs_vscale(r + j0, len - j0, inv); /* the weight of row t, as sc[t] * inv before */
            memset(o + (size_t)k * D, 0, sizeof(float) * (size_t)D);
        }
        kvs_axpy_cache_heads(s->ctype_v, o, D, nh, sc + j0, scs, kvs_kv_vrow(s, c, g, j0), D, len - j0, D);
    }
}

/* Fewer (sequence, KV head) units than threads (one sequence of a model with
 * one KV head, as Gemma 3 270M), in three phases, parts = threads: (0) job
 * (i, g, part) takes the key dots of all G heads of group g over its share
 * of the rows; (1) job (i, h) the softmax of head h; (2) job (i, g, part) the
 * value axpys of all G heads over its share of the head's elements (shares
 * of 32: the kernels' chunk; where D does not split so, over its share of the
 * heads, all elements). Each thread then reads its share of K and V once,
 * where the one pass of att_run, split by query heads, had every thread
 * read all of both. Every row's dot and every output element's fma chain
 * over the rows are those of att_run, so the results are the same bits. */
static void att_split_run(void *arg, int ith, int nth) {
    att_job *j = arg;
    (void)ith;
    const kvs_model_info *MI = &j->ss[0]->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, G = Hq / Hkv, P = nth;
    const int dsplit = D % (32 * P) == 0;
    const int njobs = j->phase == 1 ? j->n * Hq : j->n * Hkv * P;
    for (;;) {
        int job = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (job >= njobs) break;
        const int i = j->phase == 1 ? job / Hq : job / (Hkv * P);
        const int g = j->phase == 1 ? job % Hq / G : job % (Hkv * P) / P, part = job % P;
        const kvs_session *s = j->ss[i];
        const kv_layer *c = &s->kv[j->l];
        const int len = j->db->lim[i] - kvs_kv_lag(c, g);
        const int j0 = att_first_row(c, g, len, j->db->pos[i], j->window);
        float *sc = s->scores + (size_t)g * G * s->n_ctx; /* head g G + k's scores at sc + k n_ctx */
        const float *qh = j->db->q + ((size_t)i * Hq + (size_t)g * G) * D;
        float *o = j->db->att + ((size_t)i * Hq + (size_t)g * G) * D;
        if (j->phase == 0) {
            const int r0 = j0 + (int)((int64_t)(len - j0) * part / P);
            const int r1 = j0 + (int)((int64_t)(len - j0) * (part + 1) / P);
            const uint8_t *K = kvs_kv_krow(s, c, g, r0);
            if (r1 > r0)
                kvs_dot_cache_heads(s->ctype_k, qh, D, G, K, D, r1 - r0, D, s->m->attn_scale, sc + r0,
                                    (size_t)s->n_ctx);
        } else if (j->phase == 1) {
            const int k = job % Hq % G;
            float *r = sc + (size_t)k * s->n_ctx;
            const float mx = kvs_vmax(r + j0, len - j0);
            double sum = kvs_vexp_sub(r + j0, len - j0, mx);
            kvs_vscale(r + j0, len - j0, (float)(1.0 / sum));
            memset(o + (size_t)k * D, 0, sizeof(float) * (size_t)D);
        } else {
            const uint8_t *V = kvs_kv_vrow(s, c, g, j0);
            if (dsplit) {
                const int d0 = D / P * part, dn = D / P;
                kvs_axpy_cache_heads(s->ctype_v, o + d0, D, G, sc + j0, (size_t)s->n_ctx,
                                     V + kvs_cache_row_size(s->ctype_v, d0), D, len - j0, dn);
            } else {
                const int h0 = G * part / P, nh = G * (part + 1) / P - h0;
                if (nh > 0)
                    kvs_axpy_cache_heads(s->ctype_v, o + (size_t)h0 * D, D, nh, sc + (size_t)h0 * s->n_ctx + j0,
                                         (size_t)s->n_ctx, V, D, len - j0, D);
            }
        }
    }
}

static void head_norm(float *v, int nh, int D, const float *w, float eps) {
    for (int h = 0; h < nh; h++) rmsnorm(v + (size_t)h * D, v + (size_t)h * D, w, D, eps);
}

/* One position per column through every layer: db->x [n][E] holds the input
 * embeddings, db->pos [n] the positions. Column i belongs to session ss[i];
 * a session may fill several consecutive columns (kvs_session_extend: its
 * positions in order; column i then sees the rows of the columns before it,
 * causal). sbuf: per-thread score rows for that case (NULL: the sessions'
 * own). Sequence 0 of a short prefill of n_total tokens (rec = 1) records the
 * queries of positions [n_total - nq, n_total). Every column's arithmetic is
 * independent of n, of the other columns and of the thread count (per-row
 * dot products, per-head attention), hence batch == alone bit for bit. */
static void dec_step(kvs_pool *pool, dec_buf *db, kvs_session *const *ss, int n, int rec, int n_total, float *sbuf,
                     size_t sstride) {
    kvs_model *m = ss[0]->m;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff;
    const int gemma = m->arch == KVS_ARCH_GEMMA3, half = D / 2, mv = db->maxv;
    /* attention jobs: a whole GQA group each once there are enough of them for
     * the threads; with fewer units than threads (gemma3-270m has one KV head:
     * one sequence alone) att_split_run's three phases share the rows and the
     * elements out; where the scores are per-thread rows (sbuf: a session
     * extends several columns) the groups' query heads are split instead
     * (nsplit parts, att_run) */
    const int units = n * Hkv, nth = kvs_pool_size(pool), G = Hq / Hkv;
    const int nsplit0 = units >= nth ? 1 : (nth + units - 1) / units < G ? (nth + units - 1) / units : G;
    for (int i = 0; i < n; i++) {
        float *cs = db->cs + (size_t)i * D, *sn = db->sn + (size_t)i * D;
        rope_table(ss[i]->inv_freq_g, half, db->pos[i], cs, sn);
        rope_table(ss[i]->inv_freq_l, half, db->pos[i], cs + half, sn + half);
    }
    for (int l = 0; l < MI->n_layers; l++) {
        const kvs_layer_w *w = &m->layers[l];
        int kivi = 0; /* a KIVI store is read by one thread at a time: whole groups, one job each */
        for (int i = 0; i < n; i++) kivi |= ss[i]->kv[l].kivi != NULL;
        const int nsplit = kivi ? 1 : nsplit0;
        for (int i = 0; i < n; i++) rmsnorm(db->xn + (size_t)i * mv, db->x + (size_t)i * E, w->attn_norm, E, m->norm_eps);
        matvec(pool, db, n, db->xn, mv, 3, &w->wq, db->q, Hq * D, w->bq, &w->wk, db->k, Hkv * D, w->bk, &w->wv, db->v,
               Hkv * D, w->bv);
        for (int i = 0; i < n; i++) {
            kvs_session *s = ss[i];
            kv_layer *c = &s->kv[l];
            float *q = db->q + (size_t)i * Hq * D, *k = db->k + (size_t)i * Hkv * D, *v = db->v + (size_t)i * Hkv * D;
            const float *cs = db->cs + (size_t)i * D + (w->is_local ? half : 0);
            const float *sn = db->sn + (size_t)i * D + (w->is_local ? half : 0);
            int pos = db->pos[i];
            if (w->q_norm) head_norm(q, Hq, D, w->q_norm, m->norm_eps);
            if (w->k_norm) head_norm(k, Hkv, D, w->k_norm, m->norm_eps);
            for (int h = 0; h < Hq; h++) rope_apply(q + (size_t)h * D, D, cs, sn, m->rope_neox);
            for (int h = 0; h < Hkv; h++) rope_apply(k + (size_t)h * D, D, cs, sn, m->rope_neox);
            if (rec && c->q && pos < n_total && pos >= n_total - c->nq)
                for (int h = 0; h < Hq; h++)
                    memcpy(c->q + ((size_t)h * c->nq + (pos - (n_total - c->nq))) * D, q + (size_t)h * D,
                           (size_t)D * 4);
            assert(c->len < c->cap);
            for (int g = 0; g < Hkv; g++) {
                const int row = c->len - kvs_kv_lag(c, g); /* ragged heads: after the head's own rows */
                if (c->kivi) {
                    kvs_err e = {0}; /* a row fp16 cannot hold: the step's caller reports it */
                    if (kvs_kv_kivi_append(s, c, g, k + (size_t)g * D, v + (size_t)g * D, &e) && !s->kivi_err.code)
                        s->kivi_err = e;
                } else {
                    kvs_cache_from_f32(s->ctype_k, k + (size_t)g * D, kvs_kv_krow(s, c, g, row), D);
                    kvs_cache_from_f32(s->ctype_v, v + (size_t)g * D, kvs_kv_vrow(s, c, g, row), D);
                }
                kvs_kv_pos(c, g)[row] = pos;
            }
            c->len++;
            db->lim[i] = c->len;
        }
        if (nsplit > 1 && !sbuf) {
            for (int ph = 0; ph < 3; ph++) {
                att_job aj = {ss, db, l, n, w->is_local ? MI->sliding_window : 0, nsplit, NULL, 0, 0, ph};
                kvs_pool_run(pool, att_split_run, &aj);
            }
        } else {
            att_job aj = {ss, db, l, n, w->is_local ? MI->sliding_window : 0, nsplit, sbuf, sstride, 0, -1};
            kvs_pool_run(pool, att_run, &aj);
        }
        for (int i = 0; kivi && i < n; i++) kvs_kv_kivi_flush(&ss[i]->kv[l]); /* KIVI's end of step */
        matvec(pool, db, n, db->att, Hq * D, 1, &w->wo, db->o, E, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL);
        for (int i = 0; i < n; i++) {
            float *o = db->o + (size_t)i * E, *x = db->x + (size_t)i * E;
            if (gemma) rmsnorm(o, o, w->post_attn_norm, E, m->norm_eps);
            for (int e = 0; e < E; e++) x[e] += o[e];
            rmsnorm(db->xn + (size_t)i * mv, x, w->ffn_norm, E, m->norm_eps);
        }
        matvec(pool, db, n, db->xn, mv, 2, &w->gate, db->g, F, NULL, &w->up, db->u, F, NULL, NULL, NULL, 0, NULL);
        for (int i = 0; i < n; i++) {
            if (gemma) kvs_vgelu_mul(db->g + (size_t)i * F, db->u + (size_t)i * F, F);
            else kvs_vsilu_mul(db->g + (size_t)i * F, db->u + (size_t)i * F, F);
        }
        matvec(pool, db, n, db->g, F, 1, &w->down, db->o, E, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL);
        for (int i = 0; i < n; i++) {
            float *o = db->o + (size_t)i * E, *x = db->x + (size_t)i * E;
            if (gemma) rmsnorm(o, o, w->post_ffw_norm, E, m->norm_eps);
            for (int e = 0; e < E; e++) x[e] += o[e];
        }
    }
}

/* logits [n][V] from the final hidden states x [n][xstride]. */
static void dec_logits(kvs_model *m, kvs_pool *pool, dec_buf *db, int n, const float *x, int xstride, float *logits) {
    const int E = m->info.n_embd, V = m->info.n_vocab;
    for (int i = 0; i < n; i++) rmsnorm(db->xn + (size_t)i * db->maxv, x + (size_t)i * xstride, m->output_norm, E, m->norm_eps);
    matvec(pool, db, n, db->xn, db->maxv, 1, &m->output, logits, V, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL);
    float cap = m->info.final_softcap;
    if (cap > 0)
        for (size_t i = 0; i < (size_t)n * V; i++) logits[i] = cap * tanhf(logits[i] / cap);
}

/* logits [V] of one hidden state x [E] on the session's pool. */
static void output_logits(kvs_session *s, const float *x, float *logits) {
    dec_logits(s->m, s->pool, &s->db, 1, x, s->m->info.n_embd, logits);
}

static kvs_status embed_token(const kvs_model *m, int32_t tok, float *x, kvs_err *err) {
    if (tok < 0 || tok >= m->info.n_vocab)
        return kvs_errorf(err, KVS_ERR_INVALID, "token %d is out of range [0, %d)", tok, m->info.n_vocab);
    const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes;
    kvs_status st = kvs_dequant_row(m->tok_embd.type, row, x, m->info.n_embd, err);
    if (st) return st;
    for (int i = 0; i < m->info.n_embd; i++) x[i] *= m->emb_scale;
    return KVS_OK;
}

/* Can s take one more decoded token? (what) names the sequence in errors. */
static kvs_status decode_check(const kvs_session *s, const char *what, kvs_err *err) {
    if (s->n_past == 0) return kvs_errorf(err, KVS_ERR_INVALID, "decode%s: run a prefill first", what);
    if (s->n_past >= s->n_ctx)
        return kvs_errorf(err, KVS_ERR_INVALID, "decode%s: the context is full (%d positions)", what, s->n_ctx);
    for (int l = 0; l < s->m->info.n_layers; l++)
        if (kvs_kv_room(s, &s->kv[l], s->n_past, 1) < 1)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "decode%s: layer %d cache is full (%d rows)", what, l,
                              s->kv[l].cap);
    return KVS_OK;
}

/* Decode n checked sequences (embeddings already in db->x); fails only where
 * a KIVI store refused a row (the session is then to be reset). */
static kvs_status decode_run(kvs_pool *pool, dec_buf *db, kvs_session *const *ss, int n, float *logits, kvs_err *err) {
    for (int i = 0; i < n; i++) {
        db->pos[i] = ss[i]->n_past;
        kvs_kv_make_room(ss[i], ss[i]->n_past, 1);
        kvs_attn_stats_free(ss[i]); /* the cache grows: not the prefill's any more */
        kvs_recon_free(ss[i]);
    }
    /* a session alone may record its queries (kvs_session_record_window) */
    const int rec_end = n == 1 ? ss[0]->rec_end : 0;
    dec_step(pool, db, ss, n, rec_end > 0, rec_end, NULL, 0);
    for (int i = 0; i < n; i++) {
        ss[i]->modality[ss[i]->n_past] = KVS_MOD_TEXT;
        ss[i]->n_past++;
    }
    if (logits) dec_logits(ss[0]->m, pool, db, n, db->x, ss[0]->m->info.n_embd, logits);
    for (int i = 0; i < n; i++)
        if (ss[i]->kivi_err.code) {
            kvs_status st = kvs_errorf(err, ss[i]->kivi_err.code, "decode (sequence %d, position %d): %s", i,
                                       ss[i]->n_past - 1, ss[i]->kivi_err.msg);
            ss[i]->kivi_err = (kvs_err){0};
            return st;
        }
    return KVS_OK;
}

kvs_status kvs_session_decode(kvs_session *s, int32_t token, float *logits, kvs_err *err) {
    kvs_status st = decode_check(s, "", err);
    if (st) return st;
    if ((st = embed_token(s->m, token, s->db.x, err))) return st;
    if ((st = kvs_kv_kivi_seal(s, err))) return st;
    return decode_run(s->pool, &s->db, &s, 1, logits, err);
}

kvs_status kvs_batch_new(kvs_model *m, int max_seqs, int n_threads, kvs_batch **out, kvs_err *err) {
    *out = NULL;
    if (max_seqs < 1) return kvs_errorf(err, KVS_ERR_INVALID, "batch: max_seqs %d must be >= 1", max_seqs);
    kvs_batch *b = calloc(1, sizeof *b);
    if (!b) return kvs_errorf(err, KVS_ERR_NOMEM, "batch: out of memory");
    b->m = m;
    b->max_seqs = max_seqs;
    kvs_status st = kvs_pool_new(n_threads > 0 ? n_threads : m->n_threads, &b->pool, err);
    if (!st) st = kvs_dec_buf_init(&b->db, &m->info, max_seqs, err);
    if (st) {
        kvs_batch_free(b);
        return st;
    }
    *out = b;
    return KVS_OK;
}

void kvs_batch_free(kvs_batch *b) {
    if (!b) return;
    kvs_pool_free(b->pool);
    kvs_dec_buf_free(&b->db);
    free(b);
}

kvs_status kvs_batch_decode(kvs_batch *b, kvs_session *const *ss, const int32_t *tokens, int n, float *logits,
                            kvs_err *err) {
    if (n < 1 || n > b->max_seqs)
        return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: %d sequences, expected 1 .. %d", n, b->max_seqs);
    if (!ss || !tokens) return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: sessions or tokens is NULL");
    const int V = b->m->info.n_vocab, E = b->m->info.n_embd;
    for (int i = 0; i < n; i++) {
        char what[48];
        snprintf(what, sizeof what, " (batch index %d)", i);
        if (!ss[i]) return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: session %d is NULL", i);
        if (ss[i]->m != b->m)
            return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: session %d belongs to another model", i);
        for (int k = 0; k < i; k++)
            if (ss[k] == ss[i])
                return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: sessions %d and %d are the same", k, i);
        if (tokens[i] < 0 || tokens[i] >= V)
            return kvs_errorf(err, KVS_ERR_INVALID, "batch decode: token %d of session %d is out of range [0, %d)",
                              tokens[i], i, V);
        kvs_status st = decode_check(ss[i], what, err);
        if (st) return st;
    }
    for (int i = 0; i < n; i++) {
        kvs_status st = kvs_kv_kivi_seal(ss[i], err);
        if (st) return st;
    }
    for (int i = 0; i < n; i++) {
        kvs_status st = embed_token(b->m, tokens[i], b->db.x + (size_t)i * E, err);
        if (st) return st; /* tokens were checked: not reached */
    }
    return decode_run(b->pool, &b->db, ss, n, logits, err);
}

/* ---- prefill: batched ----------------------------------------------------------- */

typedef struct {
    int T;
    float *X, *XN, *Q, *K, *V, *A, *G, *U, *O; /* [T][E] [T][max] [T][Hq*D] [T][Hkv*D] x2 [T][Hq*D] [T][F] x2 [T][E] */
    float *W;                                   /* [max rows*cols] dequantised weight */
    float *S;                                   /* [threads][QTILE][kmax] attention scores, one tile per thread */
    float *KT, *VT;                             /* [threads][kmax][D] fp32 key/value tiles (non-f32 caches), or NULL */
    int kmax;                                   /* most keys one query tile may see */
    float *cs, *sn;                             /* [2][T][D/2] rope tables (global, local) */
    kvs_q8a_block *XQ;                          /* [T][nqb] quantised input of a matmul on the block-scale route, or NULL */
    int nqb;
} pf_buf;

typedef struct {
    const kvs_wmat *w;
    float *Wd;          /* [rows][cols] scratch */
    const float *X;     /* [T][cols] */
    float *OUT;         /* [T][rows] */
    const float *bias;  /* [rows] or NULL */
    int T;
} mm_job;

/* Each thread dequantises its block of weight rows and multiplies it:
 * OUT[:, r0:r1] = X W[r0:r1]^T (+ bias). */
static void mm_run(void *arg, int ith, int nth) {
    mm_job *j = arg;
    const kvs_wmat *w = j->w;
    int64_t per = (w->rows + nth - 1) / nth;
    per = (per + 15) / 16 * 16;
    int64_t r0 = per * ith, r1 = r0 + per < w->rows ? r0 + per : w->rows;
    if (r0 >= r1) return;
    const float *W;
    if (w->type == KVS_GGML_F32)
        W = (const float *)w->data + (size_t)r0 * w->cols;
    else {
        for (int64_t r = r0; r < r1; r++) {
            kvs_status st = kvs_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                                            j->Wd + (size_t)r * w->cols, w->cols, NULL);
            assert(st == KVS_OK);
            (void)st;
        }
        W = j->Wd + (size_t)r0 * w->cols;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, (int)(r1 - r0), (int)w->cols, 1.0f, j->X,
                (int)w->cols, W, (int)w->cols, 0.0f, j->OUT + r0, (int)w->rows);
    if (j->bias)
        for (int t = 0; t < j->T; t++)
            for (int64_t r = r0; r < r1; r++) j->OUT[(size_t)t * w->rows + r] += j->bias[r];
}

/* Matrices on the block-scale route (kvs_dot_bs_route: Q8_0, Q5_0, Q4_K, Q6_K
 * rows where the machine has the VNNI or AMX engine) skip the dequantisation
 * and sgemm: the chunk's activations are quantised to 8 bits once (XQ, as
 * decode does) and every thread multiplies its 16-row blocks of weights by all
 * T columns with kvs_dot_q8a_rows, integer products 4x as dense per
 * instruction as fp32 FMAs. Each token's result is then bit for bit what the
 * decode kernels give it (the route's float structure does not depend on the
 * number of columns), so prefill and decode agree exactly on these matrices. */
typedef struct {
    const float *X;
    kvs_q8a_block *XQ;
    int T, cols, nqb;
} q8_job;

static void q8_run(void *arg, int ith, int nth) {
    q8_job *j = arg;
    int per = (j->T + nth - 1) / nth, t0 = per * ith, t1 = t0 + per < j->T ? t0 + per : j->T;
    for (int t = t0; t < t1; t++)
        kvs_q8a_quantize(j->X + (size_t)t * j->cols, j->XQ + (size_t)t * j->nqb, j->cols);
}

typedef struct {
    const kvs_wmat *w;
    const kvs_q8a_block *XQ; /* [T][nqb] */
    int nqb, T;
    float *OUT;         /* [T][rows] */
    const float *bias;  /* [rows] or NULL */
} mq_job;

/* Rows [r0, r1) of one thread (whole 16-row blocks but the last): one call, so
 * the activations are packed once per thread. */
static void mq_run(void *arg, int ith, int nth) {
    mq_job *j = arg;
    const kvs_wmat *w = j->w;
    int64_t per = (w->rows + nth - 1) / nth;
    per = (per + 15) / 16 * 16;
    int64_t r0 = per * ith, r1 = r0 + per < w->rows ? r0 + per : w->rows;
    if (r0 >= r1) return;
    kvs_dot_q8a_rows(w->type, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, r1 - r0, j->XQ,
                     j->nqb, j->T, w->cols, j->OUT + r0, w->rows);
    if (j->bias)
        for (int t = 0; t < j->T; t++)
            for (int64_t r = r0; r < r1; r++) j->OUT[(size_t)t * w->rows + r] += j->bias[r];
}

/* OUT [T][rows] = X [T][cols] W^T (+ bias). quantised: X is already in b->XQ
 * (the previous call had the same input: q, k, v and gate, up share theirs). */
static void matmul(kvs_session *s, pf_buf *b, const kvs_wmat *w, const float *X, float *OUT, const float *bias,
                   int quantised) {
    if (b->XQ && kvs_dot_bs_route(w->type, w->cols)) {
        if (!quantised) {
            q8_job qj = {X, b->XQ, b->T, (int)w->cols, b->nqb};
            kvs_pool_run(s->pool, q8_run, &qj);
        }
        mq_job j = {w, b->XQ, b->nqb, b->T, OUT, bias};
        kvs_pool_run(s->pool, mq_run, &j);
        return;
    }
    mm_job j = {w, b->W, X, OUT, bias, b->T};
    kvs_pool_run(s->pool, mm_run, &j);
}

typedef struct {
    kvs_session *s;
    pf_buf *b;
    const kv_layer *c;
    int p0, len0, window; /* position of the chunk's first token, cache rows before the chunk */
    int stats_layer;      /* >= 0: accumulate the attention statistics of this layer (s->as) */
    int recon_layer;      /* >= 0: the reconstruction pass's maxima of this layer (s->rc) */
} at_job;

/* First row in [lo, hi) of P (ascending) with P[row] > p - window. */
static int first_in_window(const int32_t *P, int lo, int hi, int p, int window) {
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p - P[mid] >= window) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Which rows of head g's fp32 tiles thread ith already holds (conversion shared by heads of a group). */
typedef struct {
    int g, lo, hi;
} at_conv;

/* Attention statistics of one (query head h, tile at t0) whose normalised
 * probabilities are S [tq][nk] (keys from row 0: an uncompressed cache, no
 * window): the tile's column sums go, in double, to the thread's [Hkv][cap]
 * accumulator, the rows to the thread's head sum asum [tq][cap]; after the
 * last head each row's entropies are taken (kvs_attn_row_entropy). */
static void at_stats(const at_job *j, int ith, int h, int t0, int tq, int nk, const float *S) {
    attn_stats *as = &j->s->as;
    const kvs_model_info *MI = &j->s->m->info;
    const int Hq = MI->n_heads, G = Hq / MI->n_kv_heads, g = h / G, l = j->stats_layer, cap = as->cap;
    float *tsum = as->tsum + (size_t)ith * cap;                                /* [nk] */
    double *tcol = as->tcol + ((size_t)ith * MI->n_kv_heads + g) * cap;      /* [cap] */
    float *asum = as->asum + (size_t)ith * KVS_QTILE * cap;                  /* [tq][cap] */
    memset(tsum, 0, sizeof(float) * (size_t)nk);
    for (int i = 0; i < tq; i++) {
        const float *r = S + (size_t)i * nk;
        float *a = asum + (size_t)i * cap;
        for (int k = 0; k < nk; k++) tsum[k] += r[k];
        if (h == 0) memcpy(a, r, sizeof(float) * (size_t)nk);
        else
            for (int k = 0; k < nk; k++) a[k] += r[k];
    }
    for (int k = 0; k < nk; k++) tcol[k] += tsum[k];
    if (h != Hq - 1) return;
    for (int i = 0; i < tq; i++) {
        const int p = j->p0 + t0 + i; /* sees keys 0 .. p */
        kvs_attn_row_entropy(asum + (size_t)i * cap, p + 1, Hq, as->modality,
                             as->rowh + ((size_t)l * cap + p) * 2, as->kind + (size_t)l * cap + p);
    }
}

/* The reconstruction pass (s->rc): the maxima over the tile's rows S [tq][nk]
 * (normalised; column k is cache row kmin + k, a position: the prompt's cache
 * is uncompressed) of the chunk's keys [lo, hi), into the worker's [cap] row
 * of KV head g. */
static void at_recon(const at_job *j, int ith, int g, int kmin, int tq, int nk, const float *S) {
    const recon_stats *rc = &j->s->rc;
    const kvs_model_info *MI = &j->s->m->info;
    float *mx = rc->tmax + (((size_t)ith * MI->n_layers + j->recon_layer) * MI->n_kv_heads + g) * rc->cap;
    const int a = rc->lo > kmin ? rc->lo - kmin : 0, b = rc->hi - kmin < nk ? rc->hi - kmin : nk;
    for (int i = 0; i < tq; i++) {
        const float *r = S + (size_t)i * nk;
        for (int k = a; k < b; k++) mx[kmin + k] = r[k] > mx[kmin + k] ? r[k] : mx[kmin + k];
    }
}

/* One job of at_run: query head h against tile t0. */
static void at_one(const at_job *j, int ith, int h, int t0, at_conv *cv) {
    kvs_session *s = j->s;
    pf_buf *b = j->b;
    const kv_layer *c = j->c;
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads, G = MI->n_heads / MI->n_kv_heads, T = b->T;
    float *S = b->S + (size_t)ith * KVS_QTILE * b->kmax;
    int g = h / G;
    const int32_t *P = kvs_kv_pos(c, g);
    const int len0 = j->len0 - kvs_kv_lag(c, g); /* rows of head g before the chunk */
    int tq = T - t0 < KVS_QTILE ? T - t0 : KVS_QTILE;
    int pf = j->p0 + t0, kmax = len0 + t0 + tq;
    int kmin = j->window > 0 ? first_in_window(P, 0, kmax, pf, j->window) : 0;
    int nk = kmax - kmin;
    assert(nk <= b->kmax);
    /* rows kmin.. of head g in fp32: f32 caches in place, others converted
     * (block types a tile of this head's rows at a time: never the whole cache) */
    const float *Kc = (const float *)kvs_kv_krow(s, c, g, kmin), *Vc = (const float *)kvs_kv_vrow(s, c, g, kmin);
    float *KT = b->KT ? b->KT + (size_t)ith * b->kmax * D : NULL;
    float *VT = b->VT ? b->VT + (size_t)ith * b->kmax * D : NULL;
    /* heads of one group share the conversion when their jobs follow each other */
    const int conv = cv->g != g || cv->lo != kmin || cv->hi != kmax;
    if (KT && conv) kvs_cache_to_f32(s->ctype_k, kvs_kv_krow(s, c, g, kmin), KT, nk * D);
    if (VT && conv) kvs_cache_to_f32(s->ctype_v, kvs_kv_vrow(s, c, g, kmin), VT, nk * D);
    cv->g = g;
    cv->lo = kmin;
    cv->hi = kmax;
    if (KT) Kc = KT;
    if (VT) Vc = VT;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, nk, D, s->m->attn_scale,
                b->Q + ((size_t)t0 * Hq + h) * D, Hq * D, Kc, D, 0.0f, S, nk);
    int lo = kmin;
    for (int i = 0; i < tq; i++) {
        float *r = S + (size_t)i * nk;
        int p = pf + i;
        if (j->window > 0) lo = first_in_window(P, lo, len0 + t0 + i + 1, p, j->window);
        int a = lo - kmin, e = len0 + t0 + i + 1 - kmin; /* valid keys [a, e) */
        assert(0 <= a && a <= e && e <= nk);
        const float mx = kvs_vmax(r + a, e - a);
        double sum = kvs_vexp_sub(r + a, e - a, mx);
        float inv = (float)(1.0 / sum);
        memset(r, 0, sizeof(float) * (size_t)a);
        kvs_vscale(r + a, e - a, inv);
        memset(r + e, 0, sizeof(float) * (size_t)(nk - e));
    }
    if (j->stats_layer >= 0) at_stats(j, ith, h, t0, tq, nk, S);
    if (j->recon_layer >= 0) at_recon(j, ith, g, kmin, tq, nk, S);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, D, nk, 1.0f, S, nk, Vc, D, 0.0f,
                b->A + ((size_t)t0 * Hq + h) * D, Hq * D);
}

/* Attention of the chunk: jobs are (query head, query tile) pairs, tiles of
 * KVS_QTILE queries against the cache rows they may see: rows [0, len0) hold
 * earlier positions (maybe compressed: each KV head its own positions P),
 * rows len0 + t the chunk's token t. Query t sees rows up to len0 + t
 * (causal) with P > p - window (sliding window); scores in the thread's own
 * [QTILE][kmax] buffer. On an uncompressed cache (P[r] = r, len0 = p0) this
 * is plain causal attention. While the attention statistics are accumulated
 * a thread takes a tile with all its Hq heads in order (a row's entropy
 * needs every head's probabilities). */
static void at_run(void *arg, int ith, int nth) {
    at_job *j = arg;
    const int Hq = j->s->m->info.n_heads;
    const int ntile = (j->b->T + KVS_QTILE - 1) / KVS_QTILE;
    at_conv cv = {-1, 0, 0};
    if (j->stats_layer >= 0) {
        for (int tile = ith; tile < ntile; tile += nth)
            for (int h = 0; h < Hq; h++) at_one(j, ith, h, tile * KVS_QTILE, &cv);
        return;
    }
    for (int job = ith; job < Hq * ntile; job += nth) at_one(j, ith, job / ntile, (job % ntile) * KVS_QTILE, &cv);
}

/* Per-token work between the matrix products, split over tokens. */
enum { EW_ATTN_IN, EW_QK, EW_ATTN_OUT, EW_FFN_ACT, EW_FFN_OUT };

typedef struct {
    kvs_session *s;
    pf_buf *b;
    const kvs_layer_w *w;
    kv_layer *c;
    int stage, p0, len0, rec, n_total;
} ew_job;

static void ew_run(void *arg, int ith, int nth) {
    ew_job *j = arg;
    kvs_session *s = j->s;
    kvs_model *m = s->m;
    pf_buf *b = j->b;
    const kvs_layer_w *w = j->w;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff, T = b->T;
    const int gemma = m->arch == KVS_ARCH_GEMMA3, half = D / 2;
    int per = (T + nth - 1) / nth, t0 = per * ith, t1 = t0 + per < T ? t0 + per : T;
    for (int t = t0; t < t1; t++) {
        float *x = b->X + (size_t)t * E, *xn = b->XN + (size_t)t * E, *o = b->O + (size_t)t * E;
        switch (j->stage) {
        case EW_ATTN_IN: rmsnorm(xn, x, w->attn_norm, E, m->norm_eps); break;
        case EW_QK: {
            float *q = b->Q + (size_t)t * Hq * D, *k = b->K + (size_t)t * Hkv * D, *v = b->V + (size_t)t * Hkv * D;
            if (w->q_norm) head_norm(q, Hq, D, w->q_norm, m->norm_eps);
            if (w->k_norm) head_norm(k, Hkv, D, w->k_norm, m->norm_eps);
            size_t tab = (w->is_local ? (size_t)T * half : 0) + (size_t)t * half;
            for (int h = 0; h < Hq; h++) rope_apply(q + (size_t)h * D, D, b->cs + tab, b->sn + tab, m->rope_neox);
            for (int h = 0; h < Hkv; h++) rope_apply(k + (size_t)h * D, D, b->cs + tab, b->sn + tab, m->rope_neox);
            /* cache K, V of position p at row len0 + t */
            kv_layer *c = j->c;
            int p = j->p0 + t;
            for (int g = 0; g < Hkv; g++) {
                const int row = j->len0 - kvs_kv_lag(c, g) + t; /* ragged heads: each after its own rows */
                kvs_cache_from_f32(s->ctype_k, k + (size_t)g * D, kvs_kv_krow(s, c, g, row), D);
                kvs_cache_from_f32(s->ctype_v, v + (size_t)g * D, kvs_kv_vrow(s, c, g, row), D);
                kvs_kv_pos(c, g)[row] = p;
            }
            int first = j->n_total - c->nq; /* record queries of positions [n_total - nq, n_total) */
            if (j->rec && c->q && p >= first && p < j->n_total)
                for (int h = 0; h < Hq; h++)
                    memcpy(c->q + ((size_t)h * c->nq + (p - first)) * D, q + (size_t)h * D, (size_t)D * 4);
            break;
        }
        case EW_ATTN_OUT:
            if (gemma) rmsnorm(o, o, w->post_attn_norm, E, m->norm_eps);
            for (int i = 0; i < E; i++) x[i] += o[i];
            rmsnorm(xn, x, w->ffn_norm, E, m->norm_eps);
            break;
        case EW_FFN_ACT:
            if (gemma) kvs_vgelu_mul(b->G + (size_t)t * F, b->U + (size_t)t * F, F);
            else kvs_vsilu_mul(b->G + (size_t)t * F, b->U + (size_t)t * F, F);
            break;
        case EW_FFN_OUT:
            if (gemma) rmsnorm(o, o, w->post_ffw_norm, E, m->norm_eps);
            for (int i = 0; i < E; i++) x[i] += o[i];
            break;
        default: assert(0);
        }
    }
}

/* End of a layer's attention over a chunk: the threads' column sums of keys
 * [0, nk) go to the layer's (in thread order) and are zeroed. */
static void attn_stats_reduce(kvs_session *s, int l, int nk) {
    attn_stats *as = &s->as;
    const int Hkv = s->m->info.n_kv_heads, nth = kvs_pool_size(s->pool);
    for (int t = 0; t < nth; t++)
        for (int g = 0; g < Hkv; g++) {
            double *src = as->tcol + ((size_t)t * Hkv + g) * as->cap;           /* [cap] */
            double *dst = as->col + ((size_t)l * Hkv + g) * as->cap;            /* [cap] */
            for (int k = 0; k < nk; k++) dst[k] += src[k];
            memset(src, 0, sizeof(double) * (size_t)nk);
        }
}

/* Run tokens at positions [p0, p0+T): b->X holds their input embeddings; each
 * layer appends them after its current rows. rec: record queries (prompt of
 * n_total tokens). */
static void prefill_chunk(kvs_session *s, pf_buf *b, int p0, int rec, int n_total) {
    kvs_model *m = s->m;
    const kvs_model_info *MI = &m->info;
    const int D = MI->head_dim, T = b->T, half = D / 2;
    for (int t = 0; t < T; t++) {
        rope_table(s->inv_freq_g, half, p0 + t, b->cs + (size_t)t * half, b->sn + (size_t)t * half);
        rope_table(s->inv_freq_l, half, p0 + t, b->cs + (size_t)(T + t) * half, b->sn + (size_t)(T + t) * half);
    }
    for (int l = 0; l < MI->n_layers; l++) {
        const kvs_layer_w *w = &m->layers[l];
        kv_layer *c = &s->kv[l];
        int len0 = c->len;
        assert(len0 + T <= c->cap);
        ew_job ej = {s, b, w, c, EW_ATTN_IN, p0, len0, rec, n_total};
        kvs_pool_run(s->pool, ew_run, &ej);
        /* q, k, v (and gate, up) read the same input: quantised once when all
         * three take the route */
        const int rq = kvs_dot_bs_route(w->wq.type, w->wq.cols), rk = kvs_dot_bs_route(w->wk.type, w->wk.cols);
        matmul(s, b, &w->wq, b->XN, b->Q, w->bq, 0);
        matmul(s, b, &w->wk, b->XN, b->K, w->bk, rq);
        matmul(s, b, &w->wv, b->XN, b->V, w->bv, rq || rk);
        ej.stage = EW_QK;
        kvs_pool_run(s->pool, ew_run, &ej);
        c->len = len0 + T;
        const int stats = s->as.active && s->as.have[l] ? l : -1;
        at_job aj = {s, b, c, p0, len0, w->is_local ? MI->sliding_window : 0, stats, s->rc.active ? l : -1};
        kvs_pool_run(s->pool, at_run, &aj);
        if (stats >= 0) attn_stats_reduce(s, l, len0 + T);
        matmul(s, b, &w->wo, b->A, b->O, NULL, 0);
        ej.stage = EW_ATTN_OUT;
        kvs_pool_run(s->pool, ew_run, &ej);
        matmul(s, b, &w->gate, b->XN, b->G, NULL, 0);
        matmul(s, b, &w->up, b->XN, b->U, NULL, kvs_dot_bs_route(w->gate.type, w->gate.cols));
        ej.stage = EW_FFN_ACT;
        kvs_pool_run(s->pool, ew_run, &ej);
        matmul(s, b, &w->down, b->G, b->O, NULL, 0);
        ej.stage = EW_FFN_OUT;
        kvs_pool_run(s->pool, ew_run, &ej);
    }
}

static void pf_free(pf_buf *b) {
    free(b->X);
    free(b->XN);
    free(b->Q);
    free(b->K);
    free(b->V);
    free(b->A);
    free(b->G);
    free(b->U);
    free(b->O);
    free(b->W);
    free(b->S);
    free(b->KT);
    free(b->VT);
    free(b->cs);
    free(b->sn);
    free(b->XQ);
}

/* n tokens (or embeddings) at positions n_past.. through the batched kernels,
 * in chunks of ubatch; rec_end > 0: record the queries of positions
 * [rec_end - nq, rec_end) (a prompt: its length). logits: last position. */
static kvs_status run_chunks(kvs_session *s, const int32_t *tokens, const float *embd, int n, int rec_end,
                             float *logits, kvs_err *err) {
    kvs_model *m = s->m;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff;
    const int p_start = s->n_past;
    int ub = n < s->ubatch ? n : s->ubatch;
    size_t maxw = 0;
    int any_bs = 0;
    for (int l = 0; l < MI->n_layers; l++) {
        const kvs_wmat *ws[] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv, &m->layers[l].wo,
                                &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int i = 0; i < 7; i++) {
            if ((size_t)(ws[i]->rows * ws[i]->cols) > maxw) maxw = (size_t)(ws[i]->rows * ws[i]->cols);
            any_bs |= kvs_dot_bs_route(ws[i]->type, ws[i]->cols);
        }
    }
    int maxlen = 0; /* a query tile sees at most the longest layer's rows plus the new tokens */
    for (int l = 0; l < MI->n_layers; l++) maxlen = s->kv[l].len > maxlen ? s->kv[l].len : maxlen;
    int maxv = E > F ? E : F;
    kvs_status st = KVS_OK;
    pf_buf b = {0};
    b.kmax = maxlen + n;
    b.X = malloc((size_t)ub * E * 4);
    b.XN = malloc((size_t)ub * maxv * 4);
    b.Q = malloc((size_t)ub * Hq * D * 4);
    b.K = malloc((size_t)ub * Hkv * D * 4);
    b.V = malloc((size_t)ub * Hkv * D * 4);
    b.A = malloc((size_t)ub * Hq * D * 4);
    b.G = malloc((size_t)ub * F * 4);
    b.U = malloc((size_t)ub * F * 4);
    b.O = malloc((size_t)ub * E * 4);
    b.W = malloc(maxw * 4);
    b.S = malloc((size_t)s->n_threads * KVS_QTILE * b.kmax * 4);
    if (s->ctype_k != KVS_CACHE_F32) b.KT = malloc((size_t)s->n_threads * b.kmax * D * 4);
    if (s->ctype_v != KVS_CACHE_F32) b.VT = malloc((size_t)s->n_threads * b.kmax * D * 4);
    b.cs = malloc((size_t)2 * ub * D / 2 * 4);
    b.sn = malloc((size_t)2 * ub * D / 2 * 4);
    b.nqb = (maxv > Hq * D ? maxv : Hq * D) / 32 + 1; /* the widest matmul input: XN, G or A */
    if (any_bs && !(b.XQ = malloc((size_t)ub * b.nqb * sizeof *b.XQ))) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "prefill: out of memory for a %d-token chunk", ub);
        goto cleanup;
    }
    if (!b.X || !b.XN || !b.Q || !b.K || !b.V || !b.A || !b.G || !b.U || !b.O || !b.W || !b.S || !b.cs || !b.sn ||
        (s->ctype_k != KVS_CACHE_F32 && !b.KT) || (s->ctype_v != KVS_CACHE_F32 && !b.VT)) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "prefill: out of memory for a %d-token chunk", ub);
        goto cleanup;
    }
    for (int p0 = 0; p0 < n; p0 += b.T) {
        b.T = n - p0 < ub ? n - p0 : ub;
        kvs_kv_make_room(s, p_start + p0, b.T);
        for (int l = 0; l < MI->n_layers; l++)
            if (s->kv[l].bounded && s->kv[l].cap - s->kv[l].len < b.T) b.T = s->kv[l].cap - s->kv[l].len;
        for (int t = 0; t < b.T; t++) {
            if (tokens) {
                if ((st = embed_token(m, tokens[p0 + t], b.X + (size_t)t * E, err))) goto cleanup;
            } else
                memcpy(b.X + (size_t)t * E, embd + (size_t)(p0 + t) * E, (size_t)E * 4);
        }
        prefill_chunk(s, &b, p_start + p0, rec_end > 0, rec_end);
        s->n_past = p_start + p0 + b.T;
    }
    if (logits) output_logits(s, b.X + (size_t)(b.T - 1) * E, logits);
cleanup:
    pf_free(&b);
    return st;
}

/* KVzip's reconstruction pass over the n-token prompt just prefilled
 * (kvs_session_set_recon, kvs_backend.h): per chunk of recon_chunk context
 * tokens (fewer when n_ctx leaves less room), its input (recon.c) runs
 * through the batched kernels at positions n.. with the maxima armed for
 * the chunk's keys, then every layer drops the pass's rows. */
static kvs_status recon_pass(kvs_session *s, const int32_t *tokens, int n, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const double t0 = kvs_now_ms();
    int room = s->n_ctx - n, extra = 0, ni = 0;
    for (int l = 0; l < MI->n_layers; l++) {
        if (s->kv[l].bounded || s->kv[l].compressed || s->kv[l].len != n)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "reconstruction pass: layer %d is not the prompt's cache", l);
        if (s->kv[l].cap - n < room) room = s->kv[l].cap - n;
    }
    /* the instruction's length: the longer of the first and a later chunk's input for one token, less it */
    int32_t probe[256];
    const int later = n - 1 < KVS_RECON_PREV ? n - 1 : KVS_RECON_PREV;
    kvs_status st = kvs_recon_chunk_tokens(s->m, tokens, 0, 1, probe, 256, &ni, err);
    extra = ni - 1;
    if (!st && later > 0) st = kvs_recon_chunk_tokens(s->m, tokens, later, later + 1, probe, 256, &ni, err);
    if (st) return st;
    if (later > 0 && ni - 1 > extra) extra = ni - 1;
    int chunk = s->recon_chunk < n ? s->recon_chunk : n;
    if (chunk > room - extra) chunk = room - extra;
    if (chunk < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "reconstruction pass (KVzip): the context of %d positions leaves %d after the %d-token "
                          "prompt; the pass needs at least %d (its instruction and one token)",
                          s->n_ctx, room, n, extra + 1);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)(chunk + extra)); /* [chunk + instruction] */
    if (!in) return kvs_errorf(err, KVS_ERR_NOMEM, "reconstruction pass: out of memory");
    if ((st = kvs_recon_begin(s, n, err))) goto done;
    for (int c0 = 0; c0 < n && !st; c0 += chunk) {
        const int c1 = c0 + chunk < n ? c0 + chunk : n;
        int ns = 0;
        if ((st = kvs_recon_chunk_tokens(s->m, tokens, c0, c1, in, chunk + extra, &ns, err))) break;
        s->rc.lo = c0;
        s->rc.hi = c1;
        st = run_chunks(s, in, NULL, ns, 0, NULL, err);
        for (int l = 0; l < MI->n_layers; l++) s->kv[l].len = n; /* the pass's rows go */
        s->n_past = n;
    }
    if (!st) kvs_recon_finish(s, kvs_now_ms() - t0);
done:
    free(in);
    if (st) {
        kvs_recon_free(s);
        kvs_err_prefix(err, "reconstruction pass (KVzip)");
    }
    return st;
}

/* tokens or embd (exactly one non-NULL) */
static kvs_status prefill(kvs_session *s, const int32_t *tokens, const float *embd, int n, const uint8_t *modality,
                          float *logits, kvs_err *err) {
    kvs_model *m = s->m;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads;
    if (s->n_past != 0) return kvs_errorf(err, KVS_ERR_INVALID, "prefill: the session is not empty (reset it first)");
    if (n < 1) return kvs_errorf(err, KVS_ERR_INVALID, "prefill: empty prompt");
    if (n > s->n_ctx)
        return kvs_errorf(err, KVS_ERR_INVALID, "prefill: the prompt has %d tokens, more than the context of %d", n,
                          s->n_ctx);
    if (tokens)
        for (int i = 0; i < n; i++)
            if (tokens[i] < 0 || tokens[i] >= MI->n_vocab)
                return kvs_errorf(err, KVS_ERR_INVALID, "prefill: token %d at index %d is out of range [0, %d)",
                                  tokens[i], i, MI->n_vocab);
    if (modality)
        for (int i = 0; i < n; i++)
            if (modality[i] > KVS_MOD_AUDIO)
                return kvs_errorf(err, KVS_ERR_INVALID, "prefill: modality[%d] = %d is not a known modality", i,
                                  modality[i]);
    for (int l = 0; l < MI->n_layers; l++)
        if (s->kv[l].cap < n)
            return kvs_errorf(err, KVS_ERR_NOMEM, "prefill: layer %d cache could not be allocated", l);
    kvs_status st = KVS_OK;
    /* a window armed before the prefill (kvs_session_record_window) records instead of record_queries */
    const int armed = s->rec_end;
    int nq = armed ? 0 : s->record_queries < 0 ? n : (s->record_queries < n ? s->record_queries : n);
    for (int l = 0; l < MI->n_layers && !armed; l++) {
        kv_layer *c = &s->kv[l];
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        if (nq > 0) {
            c->q = malloc((size_t)Hq * nq * D * sizeof(float));
            if (!c->q) return kvs_errorf(err, KVS_ERR_NOMEM, "prefill: out of memory recording %d queries", nq);
            c->nq = nq;
        }
    }
    if ((st = kvs_attn_stats_begin(s, n, modality, err))) goto fail;
    if (n <= KVS_SHORT_PROMPT) {
        /* short prompts: token by token with the decode kernels (no weight dequantisation) */
        for (int t = 0; t < n; t++) {
            if (tokens) {
                if ((st = embed_token(m, tokens[t], s->db.x, err))) goto fail;
            } else
                memcpy(s->db.x, embd + (size_t)t * E, (size_t)E * 4);
            s->db.pos[0] = t;
            dec_step(s->pool, &s->db, &s, 1, 1, armed ? armed : n, NULL, 0);
        }
        if (logits) output_logits(s, s->db.x, logits);
    } else {
        if ((st = run_chunks(s, tokens, embd, n, armed ? armed : n, logits, err))) goto fail;
    }
    if ((st = kvs_attn_stats_finish(s, n, err))) goto fail;
    for (int i = 0; i < n; i++) s->modality[i] = modality ? modality[i] : KVS_MOD_TEXT;
    s->n_past = n;
    s->n_prompt = n;
    if (s->recon_chunk > 0 && tokens && (st = recon_pass(s, tokens, n, err))) goto fail;
    return KVS_OK;
fail:
    kvs_session_reset(s);
    return st;
}

kvs_status kvs_session_prefill(kvs_session *s, const int32_t *tokens, int n, const uint8_t *modality,
                               float *logits, kvs_err *err) {
    if (!tokens) return kvs_errorf(err, KVS_ERR_INVALID, "prefill: tokens is NULL");
    return prefill(s, tokens, NULL, n, modality, logits, err);
}

kvs_status kvs_session_prefill_embd(kvs_session *s, const float *embd, int n, const uint8_t *modality,
                                    float *logits, kvs_err *err) {
    if (!embd) return kvs_errorf(err, KVS_ERR_INVALID, "prefill: embd is NULL");
    for (size_t i = 0; i < (size_t)n * s->m->info.n_embd; i++)
        if (!isfinite(embd[i]))
            return kvs_errorf(err, KVS_ERR_NUMERIC, "prefill: embedding of position %zu is not finite",
                              i / (size_t)s->m->info.n_embd);
    return prefill(s, NULL, embd, n, modality, logits, err);
}

kvs_status kvs_session_extend(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    if (!tokens) return kvs_errorf(err, KVS_ERR_INVALID, "extend: tokens is NULL");
    if (n < 1) return kvs_errorf(err, KVS_ERR_INVALID, "extend: %d tokens (need >= 1)", n);
    if (s->n_past == 0) return kvs_errorf(err, KVS_ERR_INVALID, "extend: run a prefill first");
    if (n > s->n_ctx - s->n_past)
        return kvs_errorf(err, KVS_ERR_INVALID, "extend: %d tokens at position %d exceed the context of %d", n,
                          s->n_past, s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= MI->n_vocab)
            return kvs_errorf(err, KVS_ERR_INVALID, "extend: token %d at index %d is out of range [0, %d)", tokens[i],
                              i, MI->n_vocab);
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *c = &s->kv[l];
        int need = c->bounded && n > KVS_EXTEND_COLS ? KVS_EXTEND_COLS : n; /* bounded: chunks of what fits */
        int r = kvs_kv_room(s, c, s->n_past, need);
        if (r < need)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "extend: layer %d cache has room for %d rows, not %d", l, r, n);
    }
    const int p_start = s->n_past;
    kvs_status st = KVS_OK;
    kvs_attn_stats_free(s); /* the cache grows: not the prefill's any more */
    kvs_recon_free(s);
    if (s->kivi) {
        /* a KIVI store answers for the tokens it holds: each token is one
         * decode step (the store as decoding leaves it, bit for bit) */
        if ((st = kvs_kv_kivi_seal(s, err))) return st;
        for (int t = 0; t < n && !st; t++) {
            embed_token(s->m, tokens[t], s->db.x, NULL); /* checked above */
            st = decode_run(s->pool, &s->db, &s, 1, t == n - 1 ? logits : NULL, err);
        }
        return st;
    }
    if (n <= KVS_EXTEND_COLS) {
        /* one pass of the decode kernels with a column per token: each
         * column's arithmetic is that of kvs_session_decode, so the result is
         * bit-identical to decoding the tokens one by one */
        dec_buf db;
        int maxlen = 0;
        for (int l = 0; l < MI->n_layers; l++) maxlen = s->kv[l].len > maxlen ? s->kv[l].len : maxlen;
        size_t sstride = (size_t)maxlen + n;
        kvs_session **cols = malloc((size_t)n * sizeof *cols);
        /* a thread's job holds the scores of up to a GQA group's heads */
        float *sbuf = malloc((size_t)kvs_pool_size(s->pool) * (MI->n_heads / MI->n_kv_heads) * sstride * sizeof *sbuf);
        if (!cols || !sbuf || (st = kvs_dec_buf_init(&db, MI, n, err))) {
            free(cols);
            free(sbuf);
            return st ? st : kvs_errorf(err, KVS_ERR_NOMEM, "extend: out of memory for %d tokens", n);
        }
        kvs_kv_make_room(s, p_start, n);
        for (int t = 0; t < n; t++) {
            cols[t] = s;
            db.pos[t] = p_start + t;
            embed_token(s->m, tokens[t], db.x + (size_t)t * MI->n_embd, NULL); /* checked above */
        }
        dec_step(s->pool, &db, cols, n, s->rec_end > 0, s->rec_end, sbuf, sstride);
        if (logits) dec_logits(s->m, s->pool, &db, 1, db.x + (size_t)(n - 1) * MI->n_embd, MI->n_embd, logits);
        for (int t = 0; t < n; t++) s->modality[p_start + t] = KVS_MOD_TEXT;
        s->n_past = p_start + n;
        kvs_dec_buf_free(&db);
        free(cols);
        free(sbuf);
        return KVS_OK;
    }
    /* run_chunks fails only before writing anything (scratch allocation; the tokens were checked) */
    if ((st = run_chunks(s, tokens, NULL, n, s->rec_end, logits, err))) return st;
    for (int i = p_start; i < s->n_past; i++) s->modality[i] = KVS_MOD_TEXT;
    return KVS_OK;
}

