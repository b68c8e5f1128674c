/*
 * session.c -- one sequence: the forward pass on the CPU and its ragged KV
 * cache.
 *
 * Prefill runs the prompt (longer than KVS_SHORT_PROMPT tokens; shorter ones
 * go token by token through the decode kernels) in chunks of up to KVS_UBATCH tokens: each weight
 * matrix is dequantised once per chunk into a scratch buffer and multiplied
 * with OpenBLAS sgemm; attention is tiled (KVS_QTILE queries x the keys they
 * may see, never N x N) with sgemm for scores and outputs. Only the last
 * position's logits are computed. Decode multiplies quantised weight rows
 * with activations quantised to 8 bits (integer AVX2 dot products), rows
 * split over the session's thread pool; it allocates nothing.
 *
 * The cache: per layer K and V as [Hkv][cap][D] fp32 and the original
 * position of every row [Hkv][cap]. After compression each layer has its own
 * length (and capacity: kept + room for the rest of the context), each KV head
 * its own kept positions; RoPE was applied before caching, so kept keys keep
 * their rotation and decoding continues at position n_past.
 * What it is not: no sampling (server), no method logic (methods/, core/).
 */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_private.h"

#define KVS_UBATCH 2048 /* default prefill chunk (tokens) */
#define KVS_QTILE 128   /* prefill attention query tile */
#define KVS_SHORT_PROMPT 8 /* prompts up to this length run through the decode kernels */

typedef struct {
    float *k, *v;   /* [Hkv][cap][D] */
    int32_t *pos;   /* [Hkv][cap] original positions, ascending per head */
    int cap, len;
    int compressed;
    float *q;       /* [Hq][nq][D] recorded queries (post-RoPE), or NULL */
    int nq;
} kv_layer;

struct kvs_session {
    kvs_model *m;
    int n_ctx, n_threads, record_queries, ubatch;
    int n_past, n_prompt;
    kv_layer *kv;       /* [L] */
    uint8_t *modality;  /* [n_ctx] */
    kvs_pool *pool;
    float *inv_freq_g, *inv_freq_l; /* [D/2] */
    /* decode scratch (allocated once) */
    float *x, *xn, *q, *k, *v, *att, *g, *u, *o; /* [E] [E] [Hq*D] [Hkv*D] [Hkv*D] [Hq*D] [F] [F] [E] */
    kvs_q8a_block *xq;                           /* [max(E, F, Hq*D)/32] */
    float *scores;                               /* [Hq][n_ctx] */
    float *cs, *sn;                              /* [D/2] rope for one position */
    int n_prompt_cap;                            /* row length of the prefill score tiles */
};

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

/* ---- lifecycle ---------------------------------------------------------------- */

static void kv_layer_free(kv_layer *c) {
    free(c->k);
    free(c->v);
    free(c->pos);
    free(c->q);
    memset(c, 0, sizeof *c);
}

void kvs_session_free(kvs_session *s) {
    if (!s) return;
    if (s->kv)
        for (int l = 0; l < s->m->info.n_layers; l++) kv_layer_free(&s->kv[l]);
    free(s->kv);
    free(s->modality);
    kvs_pool_free(s->pool);
    free(s->inv_freq_g);
    free(s->inv_freq_l);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->g);
    free(s->u);
    free(s->o);
    free(s->xq);
    free(s->scores);
    free(s->cs);
    free(s->sn);
    free(s);
}

/* (Re)allocate a layer's buffers with capacity cap (contents undefined). */
static kvs_status kv_alloc(kv_layer *c, int Hkv, int D, int cap, kvs_err *err) {
    free(c->k);
    free(c->v);
    free(c->pos);
    c->k = malloc((size_t)Hkv * cap * D * sizeof(float));
    c->v = malloc((size_t)Hkv * cap * D * sizeof(float));
    c->pos = malloc((size_t)Hkv * cap * sizeof(int32_t));
    c->cap = cap;
    c->len = 0;
    if (!c->k || !c->v || !c->pos) return kvs_errorf(err, KVS_ERR_NOMEM, "KV cache: out of memory for %d positions", cap);
    return KVS_OK;
}

kvs_status kvs_session_new(kvs_model *m, const kvs_session_opts *o, kvs_session **out, kvs_err *err) {
    *out = NULL;
    const kvs_model_info *MI = &m->info;
    kvs_session *s = calloc(1, sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "session: out of memory");
    s->m = m;
    s->n_ctx = o && o->n_ctx > 0 ? o->n_ctx : (MI->n_ctx_train < 8192 ? MI->n_ctx_train : 8192);
    s->n_threads = o && o->n_threads > 0 ? o->n_threads : m->n_threads;
    s->record_queries = o ? o->record_queries : 0;
    s->ubatch = KVS_UBATCH;
    kvs_status st = KVS_OK;
    if (s->n_ctx > MI->n_ctx_train) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "n_ctx %d exceeds the model's context length %d", s->n_ctx,
                        MI->n_ctx_train);
        goto cleanup;
    }
    if (s->record_queries < -1) {
        st = kvs_errorf(err, KVS_ERR_INVALID, "record_queries %d must be -1, 0 or a count", s->record_queries);
        goto cleanup;
    }
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff, L = MI->n_layers;
    if ((st = kvs_pool_new(s->n_threads, &s->pool, err))) goto cleanup;
    s->kv = calloc((size_t)L, sizeof *s->kv);
    s->modality = calloc((size_t)s->n_ctx, 1);
    s->inv_freq_g = malloc((size_t)D / 2 * sizeof(float));
    s->inv_freq_l = malloc((size_t)D / 2 * sizeof(float));
    int maxv = E > F ? E : F;
    if (Hq * D > maxv) maxv = Hq * D;
    s->x = malloc((size_t)E * 4);
    s->xn = malloc((size_t)maxv * 4);
    s->q = malloc((size_t)Hq * D * 4);
    s->k = malloc((size_t)Hkv * D * 4);
    s->v = malloc((size_t)Hkv * D * 4);
    s->att = malloc((size_t)Hq * D * 4);
    s->g = malloc((size_t)F * 4);
    s->u = malloc((size_t)F * 4);
    s->o = malloc((size_t)E * 4);
    s->xq = malloc((size_t)(maxv / 32 + 1) * sizeof *s->xq);
    s->scores = malloc((size_t)Hq * s->n_ctx * 4);
    s->cs = malloc((size_t)D / 2 * 4);
    s->sn = malloc((size_t)D / 2 * 4);
    if (!s->kv || !s->modality || !s->inv_freq_g || !s->inv_freq_l || !s->x || !s->xn || !s->q || !s->k ||
        !s->v || !s->att || !s->g || !s->u || !s->o || !s->xq || !s->scores || !s->cs || !s->sn) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "session: out of memory");
        goto cleanup;
    }
    /* theta_i(pos) = pos * inv_freq[i]; scaling and frequency factors apply to global layers */
    for (int i = 0; i < D / 2; i++) {
        double g = pow((double)MI->rope_base, -2.0 * i / D) * m->rope_scale;
        if (m->rope_freqs) g /= m->rope_freqs[i];
        s->inv_freq_g[i] = (float)g;
        s->inv_freq_l[i] = (float)pow((double)MI->rope_base_local, -2.0 * i / D);
    }
    /* capacity n_ctx per layer: pages are only committed when written */
    for (int l = 0; l < L; l++)
        if ((st = kv_alloc(&s->kv[l], Hkv, D, s->n_ctx, err))) goto cleanup;
    /* the pool parallelises sgemm calls itself (each thread its own block) */
    openblas_set_num_threads(1);
    *out = s;
    return KVS_OK;
cleanup:
    kvs_session_free(s);
    return st;
}

void kvs_session_reset(kvs_session *s) {
    const kvs_model_info *MI = &s->m->info;
    for (int l = 0; l < MI->n_layers; l++) {
        kv_layer *c = &s->kv[l];
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        if (c->cap != s->n_ctx) {
            kvs_status st = kv_alloc(c, MI->n_kv_heads, MI->head_dim, s->n_ctx, NULL);
            if (st) c->cap = 0; /* next prefill reports the allocation failure */
        }
        c->len = 0;
        c->compressed = 0;
    }
    s->n_past = 0;
    s->n_prompt = 0;
}

int kvs_session_n_ctx(const kvs_session *s) { return s->n_ctx; }
void kvs_session_set_ubatch(kvs_session *s, int ubatch) { s->ubatch = ubatch > 0 ? ubatch : KVS_UBATCH; }
int kvs_session_n_past(const kvs_session *s) { return s->n_past; }
const kvs_model *kvs_session_model(const kvs_session *s) { return s->m; }

/* ---- decode: parallel matrix-vector products ----------------------------------- */

typedef struct {
    const kvs_wmat *w[3];
    float *out[3];
    const float *bias[3];
    int n;
    const float *xf;
    const kvs_q8a_block *xq;
} mv_job;

static void mv_run(void *arg, int ith, int nth) {
    mv_job *j = arg;
    int64_t total = 0;
    for (int i = 0; i < j->n; i++) total += j->w[i]->rows;
    int64_t per = (total + nth - 1) / nth;
    int64_t r0 = per * ith, r1 = r0 + per < total ? r0 + per : total;
    int64_t base = 0;
    for (int i = 0; i < j->n; i++) {
        const kvs_wmat *w = j->w[i];
        int64_t a = r0 > base ? r0 - base : 0, b = r1 - base < w->rows ? r1 - base : w->rows;
        const uint8_t *data = w->data;
        int fl = w->type == KVS_GGML_F32 || w->type == KVS_GGML_F16 || w->type == KVS_GGML_BF16;
        for (int64_t r = a; r < b; r++) {
            const void *row = data + (size_t)r * w->row_bytes;
            float y = fl ? kvs_dot_f32(w->type, row, j->xf, w->cols) : kvs_dot_q8a(w->type, row, j->xq, w->cols);
            j->out[i][r] = y + (j->bias[i] ? j->bias[i][r] : 0.0f);
        }
        base += w->rows;
    }
}

/* out_i = W_i x (+ b_i) for up to three matrices sharing the input x [cols]. */
static void matvec(kvs_session *s, const float *x, int n, const kvs_wmat *w0, float *o0, const float *b0,
                   const kvs_wmat *w1, float *o1, const float *b1, const kvs_wmat *w2, float *o2,
                   const float *b2) {
    mv_job j = {{w0, w1, w2}, {o0, o1, o2}, {b0, b1, b2}, n, x, s->xq};
    kvs_q8a_quantize(x, s->xq, w0->cols);
    kvs_pool_run(s->pool, mv_run, &j);
}

/* ---- decode: attention over the ragged cache ---------------------------------- */

typedef struct {
    kvs_session *s;
    const kv_layer *c;
    int pos, window; /* window 0: global */
} att_job;

static void att_run(void *arg, int ith, int nth) {
    att_job *j = arg;
    kvs_session *s = j->s;
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads, G = MI->n_heads / MI->n_kv_heads;
    const kv_layer *c = j->c;
    for (int h = ith; h < Hq; h += nth) {
        int g = h / G;
        const float *qh = s->q + (size_t)h * D;
        const float *K = c->k + (size_t)g * c->cap * D, *V = c->v + (size_t)g * c->cap * D;
        const int32_t *P = c->pos + (size_t)g * c->cap;
        int j0 = 0;
        if (j->window > 0) { /* positions ascending: first key inside the window */
            int lo = 0, hi = c->len;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (j->pos - P[mid] >= j->window) lo = mid + 1;
                else hi = mid;
            }
            j0 = lo;
        }
        float *sc = s->scores + (size_t)h * s->n_ctx;
        float mx = -INFINITY;
        for (int t = j0; t < c->len; t++) {
            float v = kvs_dot_ff(qh, K + (size_t)t * D, D) * s->m->attn_scale;
            sc[t] = v;
            if (v > mx) mx = v;
        }
        double sum = kvs_vexp_sub(sc + j0, c->len - j0, mx);
        float inv = (float)(1.0 / sum);
        float *o = s->att + (size_t)h * D;
        for (int d = 0; d < D; d++) o[d] = 0;
        for (int t = j0; t < c->len; t++) kvs_vaxpy(o, sc[t] * inv, V + (size_t)t * D, D);
    }
}

static void head_norm(float *v, int nh, int D, const float *w, float eps) {
    for (int h = 0; h < nh; h++) rmsnorm(v + (size_t)h * D, v + (size_t)h * D, w, D, eps);
}

/* One position through every layer; x [E] holds the input embedding.
 * Positions in [n_total - nq, n_total) of a short prefill record their queries. */
static void decode_layers(kvs_session *s, int pos, int n_total) {
    kvs_model *m = s->m;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff;
    const int gemma = m->arch == KVS_ARCH_GEMMA3;
    for (int l = 0; l < MI->n_layers; l++) {
        const kvs_layer_w *w = &m->layers[l];
        kv_layer *c = &s->kv[l];
        rmsnorm(s->xn, s->x, w->attn_norm, E, m->norm_eps);
        matvec(s, s->xn, 3, &w->wq, s->q, w->bq, &w->wk, s->k, w->bk, &w->wv, s->v, w->bv);
        if (w->q_norm) head_norm(s->q, Hq, D, w->q_norm, m->norm_eps);
        if (w->k_norm) head_norm(s->k, Hkv, D, w->k_norm, m->norm_eps);
        rope_table(w->is_local ? s->inv_freq_l : s->inv_freq_g, D / 2, pos, s->cs, s->sn);
        for (int h = 0; h < Hq; h++) rope_apply(s->q + (size_t)h * D, D, s->cs, s->sn, m->rope_neox);
        for (int h = 0; h < Hkv; h++) rope_apply(s->k + (size_t)h * D, D, s->cs, s->sn, m->rope_neox);
        if (c->q && pos < n_total && pos >= n_total - c->nq)
            for (int h = 0; h < Hq; h++)
                memcpy(c->q + ((size_t)h * c->nq + (pos - (n_total - c->nq))) * D, s->q + (size_t)h * D, (size_t)D * 4);
        assert(c->len < c->cap);
        for (int g = 0; g < Hkv; g++) {
            memcpy(c->k + ((size_t)g * c->cap + c->len) * D, s->k + (size_t)g * D, (size_t)D * 4);
            memcpy(c->v + ((size_t)g * c->cap + c->len) * D, s->v + (size_t)g * D, (size_t)D * 4);
            c->pos[(size_t)g * c->cap + c->len] = pos;
        }
        c->len++;
        att_job aj = {s, c, pos, w->is_local ? MI->sliding_window : 0};
        kvs_pool_run(s->pool, att_run, &aj);
        matvec(s, s->att, 1, &w->wo, s->o, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        if (gemma) rmsnorm(s->o, s->o, w->post_attn_norm, E, m->norm_eps);
        for (int i = 0; i < E; i++) s->x[i] += s->o[i];
        rmsnorm(s->xn, s->x, w->ffn_norm, E, m->norm_eps);
        matvec(s, s->xn, 2, &w->gate, s->g, NULL, &w->up, s->u, NULL, NULL, NULL, NULL);
        if (gemma) kvs_vgelu_mul(s->g, s->u, F);
        else kvs_vsilu_mul(s->g, s->u, F);
        matvec(s, s->g, 1, &w->down, s->o, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        if (gemma) rmsnorm(s->o, s->o, w->post_ffw_norm, E, m->norm_eps);
        for (int i = 0; i < E; i++) s->x[i] += s->o[i];
    }
}

/* logits [V] from the final hidden state x [E]. */
static void output_logits(kvs_session *s, const float *x, float *logits) {
    kvs_model *m = s->m;
    const int E = m->info.n_embd, V = m->info.n_vocab;
    rmsnorm(s->xn, x, m->output_norm, E, m->norm_eps);
    matvec(s, s->xn, 1, &m->output, logits, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    float cap = m->info.final_softcap;
    if (cap > 0)
        for (int i = 0; i < V; i++) logits[i] = cap * tanhf(logits[i] / cap);
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

kvs_status kvs_session_decode(kvs_session *s, int32_t token, float *logits, kvs_err *err) {
    if (s->n_past == 0) return kvs_errorf(err, KVS_ERR_INVALID, "decode: run a prefill first");
    if (s->n_past >= s->n_ctx)
        return kvs_errorf(err, KVS_ERR_INVALID, "decode: the context is full (%d positions)", s->n_ctx);
    for (int l = 0; l < s->m->info.n_layers; l++)
        if (s->kv[l].len >= s->kv[l].cap)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "decode: layer %d cache is full (%d rows)", l, s->kv[l].cap);
    kvs_status st = embed_token(s->m, token, s->x, err);
    if (st) return st;
    decode_layers(s, s->n_past, 0);
    s->modality[s->n_past] = KVS_MOD_TEXT;
    s->n_past++;
    if (logits) output_logits(s, s->x, logits);
    return KVS_OK;
}

/* ---- prefill: batched ----------------------------------------------------------- */

typedef struct {
    int T;
    float *X, *XN, *Q, *K, *V, *A, *G, *U, *O; /* [T][E] [T][max] [T][Hq*D] [T][Hkv*D] x2 [T][Hq*D] [T][F] x2 [T][E] */
    float *W;                                   /* [max rows*cols] dequantised weight */
    float *S;                                   /* [threads][QTILE][n] attention scores, one tile per thread */
    float *cs, *sn;                             /* [2][T][D/2] rope tables (global, local) */
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

/* OUT [T][rows] = X [T][cols] W^T (+ bias) */
static void matmul(kvs_session *s, pf_buf *b, const kvs_wmat *w, const float *X, float *OUT, const float *bias) {
    mm_job j = {w, b->W, X, OUT, bias, b->T};
    kvs_pool_run(s->pool, mm_run, &j);
}

typedef struct {
    kvs_session *s;
    pf_buf *b;
    const kv_layer *c;
    int p0, window;
} at_job;

/* Attention of the chunk: jobs are (query head, query tile) pairs, tiles of
 * KVS_QTILE queries against the keys they may see (causal, sliding window),
 * scores in the thread's own [QTILE][n] buffer. */
static void at_run(void *arg, int ith, int nth) {
    at_job *j = arg;
    kvs_session *s = j->s;
    pf_buf *b = j->b;
    const kv_layer *c = j->c;
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hq = MI->n_heads, G = MI->n_heads / MI->n_kv_heads, T = b->T;
    const int ntile = (T + KVS_QTILE - 1) / KVS_QTILE;
    float *S = b->S + (size_t)ith * KVS_QTILE * s->n_prompt_cap;
    for (int job = ith; job < Hq * ntile; job += nth) {
        int h = job / ntile, t0 = (job % ntile) * KVS_QTILE, g = h / G;
        const float *Kc = c->k + (size_t)g * c->cap * D, *Vc = c->v + (size_t)g * c->cap * D;
        int tq = T - t0 < KVS_QTILE ? T - t0 : KVS_QTILE;
        int pf = j->p0 + t0, kmax = pf + tq;
        int kmin = j->window > 0 ? pf - j->window + 1 : 0;
        if (kmin < 0) kmin = 0;
        int nk = kmax - kmin;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, nk, D, s->m->attn_scale,
                    b->Q + ((size_t)t0 * Hq + h) * D, Hq * D, Kc + (size_t)kmin * D, D, 0.0f, S, nk);
        for (int i = 0; i < tq; i++) {
            float *r = S + (size_t)i * nk;
            int p = pf + i;
            int lo = j->window > 0 ? p - j->window + 1 : 0;
            if (lo < kmin) lo = kmin;
            int a = lo - kmin, e = p - kmin + 1; /* valid keys [a, e) */
            float mx = -INFINITY;
            for (int t = a; t < e; t++) mx = r[t] > mx ? r[t] : mx;
            double sum = kvs_vexp_sub(r + a, e - a, mx);
            float inv = (float)(1.0 / sum);
            for (int t = 0; t < a; t++) r[t] = 0;
            for (int t = a; t < e; t++) r[t] *= inv;
            for (int t = e; t < nk; t++) r[t] = 0;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, D, nk, 1.0f, S, nk, Vc + (size_t)kmin * D, D, 0.0f,
                    b->A + ((size_t)t0 * Hq + h) * D, Hq * D);
    }
}

/* Per-token work between the matrix products, split over tokens. */
enum { EW_ATTN_IN, EW_QK, EW_ATTN_OUT, EW_FFN_ACT, EW_FFN_OUT };

typedef struct {
    kvs_session *s;
    pf_buf *b;
    const kvs_layer_w *w;
    kv_layer *c;
    int stage, p0, n_total;
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
            /* cache K, V at position p (uncompressed: row index == position) */
            kv_layer *c = j->c;
            int p = j->p0 + t;
            for (int g = 0; g < Hkv; g++) {
                size_t row = (size_t)g * c->cap + (size_t)p;
                memcpy(c->k + row * D, k + (size_t)g * D, (size_t)D * 4);
                memcpy(c->v + row * D, v + (size_t)g * D, (size_t)D * 4);
                c->pos[row] = p;
            }
            int first = j->n_total - c->nq; /* record queries of positions [n_total - nq, n_total) */
            if (c->q && p >= first)
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

/* Run tokens [p0, p0+T) of the prompt: b->X holds their input embeddings. */
static void prefill_chunk(kvs_session *s, pf_buf *b, int p0, int n_total) {
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
        ew_job ej = {s, b, w, c, EW_ATTN_IN, p0, n_total};
        kvs_pool_run(s->pool, ew_run, &ej);
        matmul(s, b, &w->wq, b->XN, b->Q, w->bq);
        matmul(s, b, &w->wk, b->XN, b->K, w->bk);
        matmul(s, b, &w->wv, b->XN, b->V, w->bv);
        ej.stage = EW_QK;
        kvs_pool_run(s->pool, ew_run, &ej);
        c->len = p0 + T;
        at_job aj = {s, b, c, p0, w->is_local ? MI->sliding_window : 0};
        kvs_pool_run(s->pool, at_run, &aj);
        matmul(s, b, &w->wo, b->A, b->O, NULL);
        ej.stage = EW_ATTN_OUT;
        kvs_pool_run(s->pool, ew_run, &ej);
        matmul(s, b, &w->gate, b->XN, b->G, NULL);
        matmul(s, b, &w->up, b->XN, b->U, NULL);
        ej.stage = EW_FFN_ACT;
        kvs_pool_run(s->pool, ew_run, &ej);
        matmul(s, b, &w->down, b->G, b->O, NULL);
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
    free(b->cs);
    free(b->sn);
}

/* tokens or embd (exactly one non-NULL) */
static kvs_status prefill(kvs_session *s, const int32_t *tokens, const float *embd, int n, const uint8_t *modality,
                          float *logits, kvs_err *err) {
    kvs_model *m = s->m;
    const kvs_model_info *MI = &m->info;
    const int E = MI->n_embd, D = MI->head_dim, Hq = MI->n_heads, Hkv = MI->n_kv_heads, F = MI->n_ff;
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
    int nq = s->record_queries < 0 ? n : (s->record_queries < n ? s->record_queries : n);
    for (int l = 0; l < MI->n_layers; l++) {
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
    if (n <= KVS_SHORT_PROMPT) {
        /* short prompts: token by token with the decode kernels (no weight dequantisation) */
        for (int t = 0; t < n; t++) {
            if (tokens) {
                if ((st = embed_token(m, tokens[t], s->x, err))) goto short_fail;
            } else
                memcpy(s->x, embd + (size_t)t * E, (size_t)E * 4);
            decode_layers(s, t, n);
        }
        for (int i = 0; i < n; i++) s->modality[i] = modality ? modality[i] : KVS_MOD_TEXT;
        s->n_past = n;
        s->n_prompt = n;
        if (logits) output_logits(s, s->x, logits);
        return KVS_OK;
    short_fail:
        kvs_session_reset(s);
        return st;
    }
    int ub = n < s->ubatch ? n : s->ubatch;
    size_t maxw = 0;
    for (int l = 0; l < MI->n_layers; l++) {
        const kvs_wmat *ws[] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv, &m->layers[l].wo,
                                &m->layers[l].gate, &m->layers[l].up, &m->layers[l].down};
        for (int i = 0; i < 7; i++)
            if ((size_t)(ws[i]->rows * ws[i]->cols) > maxw) maxw = (size_t)(ws[i]->rows * ws[i]->cols);
    }
    int maxv = E > F ? E : F;
    pf_buf b = {0};
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
    b.S = malloc((size_t)s->n_threads * KVS_QTILE * n * 4);
    s->n_prompt_cap = n;
    b.cs = malloc((size_t)2 * ub * D / 2 * 4);
    b.sn = malloc((size_t)2 * ub * D / 2 * 4);
    if (!b.X || !b.XN || !b.Q || !b.K || !b.V || !b.A || !b.G || !b.U || !b.O || !b.W || !b.S || !b.cs || !b.sn) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "prefill: out of memory for a %d-token chunk", ub);
        goto cleanup;
    }
    for (int p0 = 0; p0 < n; p0 += ub) {
        b.T = n - p0 < ub ? n - p0 : ub;
        for (int t = 0; t < b.T; t++) {
            if (tokens) {
                if ((st = embed_token(m, tokens[p0 + t], b.X + (size_t)t * E, err))) goto cleanup;
            } else
                memcpy(b.X + (size_t)t * E, embd + (size_t)(p0 + t) * E, (size_t)E * 4);
        }
        prefill_chunk(s, &b, p0, n);
    }
    for (int i = 0; i < n; i++) s->modality[i] = modality ? modality[i] : KVS_MOD_TEXT;
    s->n_past = n;
    s->n_prompt = n;
    if (logits) output_logits(s, b.X + (size_t)(b.T - 1) * E, logits);
cleanup:
    pf_free(&b);
    if (st) kvs_session_reset(s);
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

/* ---- copies, views, compression --------------------------------------------------- */

kvs_status kvs_session_copy(kvs_session *dst, const kvs_session *src, kvs_err *err) {
    if (dst == src) return KVS_OK;
    if (dst->m != src->m) return kvs_errorf(err, KVS_ERR_INVALID, "session copy: sessions of different models");
    if (dst->n_ctx < src->n_past)
        return kvs_errorf(err, KVS_ERR_INVALID, "session copy: destination context %d < source length %d", dst->n_ctx,
                          src->n_past);
    const kvs_model_info *MI = &src->m->info;
    const int D = MI->head_dim, Hkv = MI->n_kv_heads, Hq = MI->n_heads;
    kvs_session_reset(dst);
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *a = &src->kv[l];
        kv_layer *c = &dst->kv[l];
        int cap = a->len + (dst->n_ctx - src->n_past);
        if (c->cap != cap) {
            kvs_status st = kv_alloc(c, Hkv, D, cap, err);
            if (st) {
                kvs_session_reset(dst);
                return st;
            }
        }
        for (int g = 0; g < Hkv; g++) {
            memcpy(c->k + (size_t)g * cap * D, a->k + (size_t)g * a->cap * D, (size_t)a->len * D * 4);
            memcpy(c->v + (size_t)g * cap * D, a->v + (size_t)g * a->cap * D, (size_t)a->len * D * 4);
            memcpy(c->pos + (size_t)g * cap, a->pos + (size_t)g * a->cap, (size_t)a->len * 4);
        }
        c->len = a->len;
        c->compressed = a->compressed;
        if (a->q) {
            c->q = malloc((size_t)Hq * a->nq * D * 4);
            if (!c->q) {
                kvs_session_reset(dst);
                return kvs_errorf(err, KVS_ERR_NOMEM, "session copy: out of memory for queries");
            }
            memcpy(c->q, a->q, (size_t)Hq * a->nq * D * 4);
            c->nq = a->nq;
        }
    }
    memcpy(dst->modality, src->modality, (size_t)src->n_past);
    dst->n_past = src->n_past;
    dst->n_prompt = src->n_prompt;
    return KVS_OK;
}

kvs_status kvs_session_cache_view(const kvs_session *s, int include_local, kvs_cache_view *out,
                                  kvs_layer *layers_storage, int *layer_map, int *n_mapped, kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hkv = MI->n_kv_heads, Hq = MI->n_heads;
    if (s->n_prompt == 0) return kvs_errorf(err, KVS_ERR_INVALID, "cache view: no prefill in this session");
    int n = 0;
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *c = &s->kv[l];
        if (!include_local && s->m->layers[l].is_local) continue;
        if (c->compressed || c->len != s->n_prompt)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "cache view: layer %d is compressed or was extended by decoding (%d rows, prompt %d)", l,
                              c->len, s->n_prompt);
        kvs_layer *L = &layers_storage[n];
        memset(L, 0, sizeof *L);
        L->k = (kvs_view){c->k, KVS_F32, KVS_HOST, Hkv, c->len, D, (int64_t)c->cap * D, D};
        L->v = (kvs_view){c->v, KVS_F32, KVS_HOST, Hkv, c->len, D, (int64_t)c->cap * D, D};
        if (c->q) L->q = (kvs_view){c->q, KVS_F32, KVS_HOST, Hq, c->nq, D, (int64_t)c->nq * D, D};
        else L->q = (kvs_view){NULL, KVS_F32, KVS_HOST, Hq, 0, D, 0, D};
        layer_map[n++] = l;
    }
    if (n == 0) return kvs_errorf(err, KVS_ERR_INVALID, "cache view: no layer selected (all layers are local)");
    out->n_layers = n;
    out->layers = layers_storage;
    out->modality = s->modality;
    *n_mapped = n;
    return KVS_OK;
}

static int64_t row_bytes(const kvs_model_info *MI) { return (int64_t)MI->n_kv_heads * MI->head_dim * 2 * 4; }

void kvs_session_kv_stats(const kvs_session *s, kvs_kv_stats *st) {
    const kvs_model_info *MI = &s->m->info;
    memset(st, 0, sizeof *st);
    st->n_layers = MI->n_layers;
    st->n_prompt = s->n_prompt;
    for (int l = 0; l < MI->n_layers; l++) {
        const kv_layer *c = &s->kv[l];
        st->is_local[l] = s->m->layers[l].is_local;
        st->compressed[l] = c->compressed;
        st->tokens_before[l] = st->tokens_after[l] = c->len;
        st->bytes_before[l] = st->bytes_after[l] = (int64_t)c->len * row_bytes(MI);
        if (st->is_local[l]) st->bytes_before_local += st->bytes_before[l];
        else st->bytes_before_global += st->bytes_before[l];
    }
    st->bytes_after_local = st->bytes_before_local;
    st->bytes_after_global = st->bytes_before_global;
    st->bytes_before_total = st->bytes_after_total = st->bytes_before_local + st->bytes_before_global;
    snprintf(st->method, sizeof st->method, "full");
}

kvs_status kvs_session_apply_plan(kvs_session *s, const kvs_plan *plan, const int *layer_map, kvs_kv_stats *stats,
                                  kvs_err *err) {
    const kvs_model_info *MI = &s->m->info;
    const int D = MI->head_dim, Hkv = MI->n_kv_heads;
    kvs_status st = kvs_plan_check(plan, err);
    if (st) return st;
    if (plan->n_kv_heads != Hkv || plan->n_tokens != s->n_prompt || plan->n_layers < 1 ||
        plan->n_layers > MI->n_layers)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "apply plan: plan shape (%d layers, %d KV heads, %d tokens) does not fit the cache (%d layers, %d KV heads, %d prompt tokens)",
                          plan->n_layers, plan->n_kv_heads, plan->n_tokens, MI->n_layers, Hkv, s->n_prompt);
    kvs_kv_stats before;
    kvs_session_kv_stats(s, &before);
    kvs_layer *views = calloc((size_t)plan->n_layers, sizeof *views);
    kvs_dense_cache dense = {0};
    if (!views) return kvs_errorf(err, KVS_ERR_NOMEM, "apply plan: out of memory");
    for (int pl = 0; pl < plan->n_layers; pl++) {
        int l = layer_map[pl];
        if (l < 0 || l >= MI->n_layers) {
            st = kvs_errorf(err, KVS_ERR_INVALID, "apply plan: plan layer %d maps to model layer %d (out of range)", pl, l);
            goto cleanup;
        }
        for (int q = 0; q < pl; q++)
            if (layer_map[q] == l) {
                st = kvs_errorf(err, KVS_ERR_INVALID, "apply plan: model layer %d appears twice in the layer map", l);
                goto cleanup;
            }
        const kv_layer *c = &s->kv[l];
        if (c->compressed || c->len != s->n_prompt) {
            st = kvs_errorf(err, KVS_ERR_INVALID,
                            "apply plan: layer %d is already compressed or extended by decoding (%d rows, prompt %d)", l,
                            c->len, s->n_prompt);
            goto cleanup;
        }
        views[pl].k = (kvs_view){c->k, KVS_F32, KVS_HOST, Hkv, c->len, D, (int64_t)c->cap * D, D};
        views[pl].v = (kvs_view){c->v, KVS_F32, KVS_HOST, Hkv, c->len, D, (int64_t)c->cap * D, D};
        views[pl].q = (kvs_view){NULL, KVS_F32, KVS_HOST, MI->n_heads, 0, D, 0, D};
    }
    kvs_cache_view cv = {plan->n_layers, views, s->modality};
    if ((st = kvs_apply(&cv, plan, &dense, err))) goto cleanup;
    int room = s->n_ctx - s->n_past;
    for (int pl = 0; pl < plan->n_layers; pl++) {
        int l = layer_map[pl];
        kv_layer *c = &s->kv[l];
        const kvs_dense_layer *dl = &dense.layers[pl];
        int B = plan->layers[pl].budget;
        assert(dl->n_tokens == B && dl->n_kv_heads == Hkv && dl->head_dim == D);
        int cap = B + room;
        float *nk = malloc((size_t)Hkv * cap * D * 4), *nv = malloc((size_t)Hkv * cap * D * 4);
        int32_t *np = malloc((size_t)Hkv * cap * 4);
        if (!nk || !nv || !np) {
            free(nk);
            free(nv);
            free(np);
            st = kvs_errorf(err, KVS_ERR_NOMEM, "apply plan: layer %d: out of memory", l);
            goto cleanup;
        }
        for (int g = 0; g < Hkv; g++) {
            memcpy(nk + (size_t)g * cap * D, dl->k + (size_t)g * B * D, (size_t)B * D * 4);
            memcpy(nv + (size_t)g * cap * D, dl->v + (size_t)g * B * D, (size_t)B * D * 4);
            for (int i = 0; i < B; i++) np[(size_t)g * cap + i] = plan->layers[pl].idx[(size_t)g * B + i];
        }
        free(c->k);
        free(c->v);
        free(c->pos);
        free(c->q);
        c->q = NULL;
        c->nq = 0;
        c->k = nk;
        c->v = nv;
        c->pos = np;
        c->cap = cap;
        c->len = B;
        c->compressed = 1;
    }
    if (stats) {
        kvs_kv_stats after;
        kvs_session_kv_stats(s, &after);
        *stats = after;
        for (int l = 0; l < MI->n_layers; l++) {
            stats->tokens_before[l] = before.tokens_before[l];
            stats->bytes_before[l] = before.bytes_before[l];
        }
        stats->bytes_before_local = before.bytes_before_local;
        stats->bytes_before_global = before.bytes_before_global;
        stats->bytes_before_total = before.bytes_before_total;
        snprintf(stats->method, sizeof stats->method, "%s", plan->method);
        snprintf(stats->note, sizeof stats->note, "%s", plan->note);
    }
cleanup:
    kvs_dense_cache_free(&dense);
    free(views);
    return st;
}

int kvs_method_queries_needed(const kvs_method *m, const kvs_params *p, int N) {
    if (!m) return 0;
    if (m->needs & KVS_NEED_Q_ALL) return N;
    if (m->needs & KVS_NEED_Q_WINDOW) {
        int w = m->queries_wanted ? m->queries_wanted(p, N) : N;
        return w < 1 ? 1 : (w > N ? N : w);
    }
    return 0;
}

kvs_status kvs_session_compress(kvs_session *s, const kvs_compress_opts *o, kvs_kv_stats *stats, kvs_err *err) {
    double t0 = kvs_now_ms();
    kvs_kv_stats local_stats;
    if (!stats) stats = &local_stats;
    if (!o->method || !strcmp(o->method->name, "full")) {
        kvs_session_kv_stats(s, stats);
        stats->compress_ms = kvs_now_ms() - t0;
        return KVS_OK;
    }
    const kvs_model_info *MI = &s->m->info;
    kvs_layer *layers = malloc(sizeof(kvs_layer) * KVS_MAX_LAYERS);
    int map[KVS_MAX_LAYERS], nm = 0;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_status st;
    if (!layers) return kvs_errorf(err, KVS_ERR_NOMEM, "compress: out of memory");
    kvs_cache_view cv;
    if ((st = kvs_session_cache_view(s, o->compress_local, &cv, layers, map, &nm, err))) goto cleanup;
    int N = s->n_prompt;
    int want = kvs_method_queries_needed(o->method, &o->params, N);
    if (want > 0) {
        for (int i = 0; i < nm; i++) {
            kvs_layer *L = &layers[i];
            if (!L->q.data || L->q.n_tokens < want) {
                st = kvs_errorf(err, KVS_ERR_INVALID,
                                "compress: method %s needs the queries of the last %d prompt positions but the session recorded %d (set record_queries)",
                                o->method->name, want, L->q.data ? L->q.n_tokens : 0);
                goto cleanup;
            }
            /* the last `want` recorded queries */
            L->q.data = (const float *)L->q.data + (size_t)(L->q.n_tokens - want) * MI->head_dim;
            L->q.n_tokens = want;
        }
    } else
        for (int i = 0; i < nm; i++) layers[i].q = (kvs_view){NULL, KVS_F32, KVS_HOST, MI->n_heads, 0, MI->head_dim, 0, MI->head_dim};
    if ((st = kvs_compress(o->method, &o->params, &cv, &o->budget, o->threads > 0 ? o->threads : s->n_threads,
                           &plan, err)))
        goto cleanup;
    if ((st = kvs_session_apply_plan(s, &plan, map, stats, err))) goto cleanup;
    stats->compress_ms = kvs_now_ms() - t0;
cleanup:
    kvs_plan_free(&plan);
    free(layers);
    return st;
}
