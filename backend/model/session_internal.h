/*
 * session_internal.h -- the session's data shared by session.c (the cache:
 * lifecycle, copies, views, compression, sliding-window trim) and forward.c
 * (the forward pass: decode, batches, prefill, extend). Not part of any API;
 * nothing outside these two files includes it.
 */
#ifndef KVS_SESSION_INTERNAL_H
#define KVS_SESSION_INTERNAL_H

#include "engine_private.h"
#include "kivi.h"

#define KVS_UBATCH 2048 /* default prefill chunk (tokens) */
#define KVS_QTILE 128   /* prefill attention query tile */
#define KVS_SHORT_PROMPT 8 /* prompts up to this length run through the decode kernels */
#define KVS_EXTEND_COLS 64 /* extends up to this length run as one pass of the decode kernels */

typedef struct {
    uint8_t *k, *v; /* [Hkv][cap] rows of D elements of the K / V cache type (a block
                       type's row is D / 32 blocks) */
    int32_t *pos;   /* [Hkv][cap] original positions, ascending per head */
    int cap, len;
    int compressed;
    int bounded;    /* sliding-window layer trimmed to its window: cap <= window + slack, old rows dropped */
    float *q;       /* [Hq][nq][D] recorded queries (post-RoPE, fp32), or NULL */
    int nq;
    float *kf, *vf; /* [Hkv][len][D] fp32 copies of K / V where its type is a block type
                       (Q8_0, Q4_0), made for a cache view (methods read fp32), or NULL */
    int32_t *lag;   /* [Hkv] or NULL: after a ragged plan (per-head counts) head g holds
                       len - lag[g] rows in a capacity of cap - lag[g] (heads packed one
                       after the other: only each head's own rows are stored); every step
                       appends one row to every head, so the lags stay fixed; attention
                       reads only a head's own rows */
    kvs_kivi_head **kivi; /* [nkivi = Hkv] a KIVI session's stores once sealed (kivi_cache.c;
                             k, v are then NULL), else NULL: rows in k, v */
    int nkivi;
} kv_layer;

/* Rows head g of layer c holds fewer than c->len (0 unless ragged). */
static inline int kvs_kv_lag(const kv_layer *c, int g) { return c->lag ? c->lag[g] : 0; }

/* First row of head g in layer c's buffers: g * cap, or packed after the
 * shorter capacities of the heads before it (ragged). */
static inline size_t kvs_kv_off(const kv_layer *c, int g) {
    size_t off = (size_t)g * c->cap;
    for (int i = 0; c->lag && i < g; i++) off -= (size_t)c->lag[i];
    return off;
}

/* Original positions of head g's rows. */
static inline int32_t *kvs_kv_pos(const kv_layer *c, int g) { return c->pos + kvs_kv_off(c, g); }

/* Decode scratch for up to cap sequences (allocated once). */
typedef struct {
    int cap, maxv, nqb;
    float *x, *xn, *q, *k, *v, *att, *g, *u, *o; /* [cap][E] [cap][maxv] [cap][Hq*D] [cap][Hkv*D] x2 [cap][Hq*D] [cap][F] x2 [cap][E] */
    kvs_q8a_block *xq;                           /* [cap][nqb] */
    float *cs, *sn;                              /* [cap][2][D/2] rope of each sequence's position (global, local) */
    int *pos;                                    /* [cap] position each sequence writes */
    int *lim;                                    /* [cap] rows its query sees (its own row + 1) */
} dec_buf;

/* Attention statistics of the prompt accumulated during prefill
 * (kvs_session_set_attn_stats), what kvs_layer.attn_colsum / attn_ent hand
 * to the methods: per layer the GQA-mean column sums over all n queries and
 * the entropies of the head-averaged attention. Layer l has them when
 * have[l] (a global layer whose logits use the contract's 1/sqrt(d) scale);
 * all are valid only while n == n_prompt > 0 and the cache is the
 * uncompressed prefill cache (anything that changes the cache sets n = 0). */
typedef struct {
    int n;                   /* prompt length they describe; 0: none */
    int cap;                 /* tokens the buffers below hold */
    double *col;             /* [L][Hkv][cap] column sums (sum over heads, rows) */
    float *colsum;           /* [L][Hkv][cap] the contract's colsum, made at the end */
    double *rowh;            /* [L][cap][2] per-row entropies (kvs_attn_row_entropy) */
    int8_t *kind;            /* [L][cap] row kinds */
    kvs_entropy_stats *ent;  /* [L] */
    uint8_t *have;           /* [L] */
    /* per prefill: per-thread scratch of the accumulation in at_run */
    double *tcol;            /* [threads][Hkv][cap] */
    float *asum;             /* [threads][QTILE][cap] a tile's rows summed over heads */
    float *tsum;             /* [threads][cap] a tile's column sums of one head */
    const uint8_t *modality; /* the prompt's, or NULL (all text), during prefill */
    int active;              /* a prefill is accumulating them */
} attn_stats;

/* The context-reconstruction statistic (kvs_session_set_recon; recon.c,
 * forward.c's recon_pass): kvs_layer.attn_recon_max of every layer, valid
 * only while n == n_prompt > 0 and the layer is the uncompressed prefill
 * cache. During the pass (active) each worker keeps its own maxima of the
 * keys [lo, hi) of the chunk being reconstructed. */
#define KVS_RECON_CHUNK 2048 /* context tokens per reconstruction chunk (kvpress's chunk_size) */
#define KVS_RECON_PREV 8     /* tokens of the chunk before that prompt a later chunk (prev_postfix_size) */
typedef struct {
    int n;       /* prompt length it describes; 0: none */
    int cap;     /* tokens the buffers hold */
    float *max;  /* [L][Hkv][cap] */
    float *tmax; /* [threads][L][Hkv][cap] per-worker maxima during the pass */
    int lo, hi;  /* keys whose maxima the current chunk takes */
    int active;  /* a pass is accumulating */
    double ms;   /* the pass's wall time */
} recon_stats;

struct kvs_session {
    kvs_model *m;
    int n_ctx, n_threads, record_queries, ubatch;
    int ctype_k, ctype_v; /* kvs_cache_type of K and of V */
    size_t rsz_k, rsz_v;  /* bytes of one cache row (head_dim elements) of K, of V */
    int kivi;             /* 0, or the K cache type KVS_CACHE_KIVI2 / KIVI4: then ctype_k, ctype_v
                             are f16 (the prefill's rows) and kivi_cfg the stores' config */
    kvs_kivi_config kivi_cfg;
    kvs_err kivi_err;     /* the first row a store refused during a decode step (forward.c reports it) */
    int n_past, n_prompt;
    int rec_end;        /* > 0: kvs_session_record_window armed: record queries of [rec_end - nq, rec_end) */
    kv_layer *kv;       /* [L] */
    uint8_t *modality;  /* [n_ctx] */
    kvs_pool *pool;
    float *inv_freq_g, *inv_freq_l; /* [D/2] */
    dec_buf db;                     /* decode scratch of one sequence */
    float *scores;                  /* [Hq][n_ctx] decode attention scores */
    int want_attn_stats;            /* kvs_session_set_attn_stats */
    attn_stats as;
    int recon_chunk;                /* kvs_session_set_recon: 0 off, else context tokens per chunk */
    recon_stats rc;
};

struct kvs_batch {
    kvs_model *m;
    int max_seqs;
    kvs_pool *pool;
    dec_buf db;
};

/* The first of rows [0, n) of a KV head whose position P[row] a query at
 * position pos still sees in a window of `window` positions (positions
 * ascend per head, so a binary search); n if none. */
static inline int kvs_kv_first_visible(const int32_t *P, int n, int pos, int window) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (pos - P[mid] >= window) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Row n of KV head g in layer c's K / V buffer. */
static inline uint8_t *kvs_kv_krow(const kvs_session *s, const kv_layer *c, int g, int n) {
    return c->k + (kvs_kv_off(c, g) + (size_t)n) * s->rsz_k;
}
static inline uint8_t *kvs_kv_vrow(const kvs_session *s, const kv_layer *c, int g, int n) {
    return c->v + (kvs_kv_off(c, g) + (size_t)n) * s->rsz_v;
}

/* session.c */
kvs_status kvs_dec_buf_init(dec_buf *b, const kvs_model_info *MI, int cap, kvs_err *err);
void kvs_dec_buf_free(dec_buf *b);
/* Make room for `need` rows at positions p, p+1, ... in every trimmed
 * sliding-window layer (drops the rows no query can see any more). */
void kvs_kv_make_room(kvs_session *s, int p, int need);
/* Every bounded (trimmed sliding-window) layer drops the rows no query at position >= p can see. */
void kvs_kv_drop_bounded(kvs_session *s, int p);
/* Rows layer c can take from position p on (trimmed layers: after dropping);
 * exact only when below need. */
int kvs_kv_room(const kvs_session *s, const kv_layer *c, int p, int need);
/* attn_stats.c: the prompt's attention statistics (s->as). free: drop them
 * (anything that changes the cache). begin: before a prefill of n tokens
 * from position 0 (modality [n] or NULL, held until finish): allocates and
 * arms the accumulation when asked for and n > KVS_SHORT_PROMPT. finish:
 * after it, makes the contract's values (valid from then on). copy: dst
 * gets src's (if any). view: out's attn_colsum / attn_ent for model layer l
 * (NULL where absent or no longer valid). */
void kvs_attn_stats_free(kvs_session *s);
kvs_status kvs_attn_stats_begin(kvs_session *s, int n, const uint8_t *modality, kvs_err *err);
kvs_status kvs_attn_stats_finish(kvs_session *s, int n, kvs_err *err);
kvs_status kvs_attn_stats_copy(kvs_session *dst, const kvs_session *src, kvs_err *err);
void kvs_attn_stats_view(const kvs_session *s, int l, kvs_layer *out);

/* recon.c: the reconstruction statistic (s->rc). free: drop it (anything
 * that changes the cache). begin: before the pass over an n-token prompt
 * (zeroed per-worker maxima, armed). finish: reduce the workers' maxima (valid
 * from then on; ms the pass's time). copy: dst gets src's (if any). view:
 * out's attn_recon_max for model layer l (NULL where absent or no longer
 * valid). */
void kvs_recon_free(kvs_session *s);
kvs_status kvs_recon_begin(kvs_session *s, int n, kvs_err *err);
void kvs_recon_finish(kvs_session *s, double ms);
kvs_status kvs_recon_copy(kvs_session *dst, const kvs_session *src, kvs_err *err);
void kvs_recon_view(const kvs_session *s, int l, kvs_layer *out);

/* kivi_cache.c: the KIVI stores of a session (s->kivi set). */
/* The stores' config from the session's K and V types (both kivi), G and R (<= 0: KIVI's). */
kvs_status kvs_kivi_session_config(const kvs_model *m, int ctk, int ctv, int group, int residual,
                                   kvs_kivi_config *out, kvs_err *err);
void kvs_kv_kivi_free(kv_layer *c);
/* Every layer not yet sealed: its stores from its fp16 rows, which are freed. */
kvs_status kvs_kv_kivi_seal(kvs_session *s, kvs_err *err);
int kvs_kv_kivi_sealed(const kvs_session *s); /* 1 if any layer is */
/* Appends one token's K and V rows (fp32 [D]) to head g's store. */
kvs_status kvs_kv_kivi_append(const kvs_session *s, kv_layer *c, int g, const float *k, const float *v,
                              kvs_err *err);
void kvs_kv_kivi_flush(kv_layer *c); /* KIVI's end-of-step quantisation, every head */
/* Decode attention of the nh query heads q [nh][D] of KV head g over its
 * whole store of len tokens: o [nh][D]; sc: scratch of nh x len floats. */
void kvs_kv_kivi_attend(const kvs_session *s, const kv_layer *c, int g, const float *q, int nh, int len, float *sc,
                        float *o);
/* Bytes of layer c: the stores' (kvs_kivi_stats), or for fp16 rows not yet
 * sealed the bytes sealing gives them (kvs_kivi_size, flushed). */
int64_t kvs_kv_kivi_bytes(const kvs_session *s, const kv_layer *c);
/* The same for n rows in every KV head of one layer. */
int64_t kvs_kv_kivi_prompt_bytes(const kvs_session *s, int n);

#endif
