/*
 * test_cache.c -- kvs_cache_validate (valid shapes fill kvs_shape; every rule
 * violated once, with the message naming the layer / head / token), and the
 * dense cache: view on an uncompressed one, refusal on a compressed one, free;
 * the threaded finiteness scan reports the same first bad value on 1-5 threads.
 */
#include "kvsieve.h"
#include "test_util.h"

static kvs_err e_, *e = &e_;

enum { L = 3, H = 2, N = 20, D = 4, HQ = 4, NQ = 5 };
static float K[L][H][N][D], V[L][H][N][D], Q[L][HQ][NQ][D]; /* [L][Hkv][N][d], [L][Hq][Nq][d] */
static kvs_layer layers[L];
static uint8_t modality[N];

static kvs_cache_view make_cache(int with_q) {
    uint64_t r = 1;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                for (int c = 0; c < D; c++) {
                    K[l][h][n][c] = (float)kvs_rng_normal(&r);
                    V[l][h][n][c] = (float)kvs_rng_normal(&r);
                }
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HQ; h++)
            for (int n = 0; n < NQ; n++)
                for (int c = 0; c < D; c++) Q[l][h][n][c] = (float)kvs_rng_normal(&r);
    for (int l = 0; l < L; l++) {
        layers[l].k = kvs_view_make(K[l], KVS_F32, H, N, D);
        layers[l].v = kvs_view_make(V[l], KVS_F32, H, N, D);
        layers[l].q = with_q ? kvs_view_make(Q[l], KVS_F32, HQ, NQ, D) : kvs_view_make(NULL, KVS_F32, 0, 0, D);
    }
    for (int n = 0; n < N; n++) modality[n] = n >= 5 && n < 12 ? KVS_MOD_IMAGE : KVS_MOD_TEXT;
    kvs_cache_view c = {L, layers, modality};
    return c;
}

static void test_valid(void) {
    kvs_cache_view c = make_cache(1);
    kvs_shape s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(kvs_cache_validate(&c, &s, e), e);
    CHECK_EQ_INT(s.n_layers, L);
    CHECK_EQ_INT(s.n_tokens, N);
    CHECK_EQ_INT(s.n_kv_heads, H);
    CHECK_EQ_INT(s.n_q_heads, HQ);
    CHECK_EQ_INT(s.head_dim, D);
    CHECK_EQ_INT(s.n_queries, NQ);
    CHECK_EQ_INT(s.threads, 1);
    c = make_cache(0);
    CHECK_OK(kvs_cache_validate(&c, &s, e), e);
    CHECK_EQ_INT(s.n_queries, 0);
    CHECK_EQ_INT(s.n_q_heads, 0);
    c.modality = NULL;
    CHECK_OK(kvs_cache_validate(&c, NULL, e), e);
    /* fp16 / bf16 caches and Nq == N */
    static uint16_t kh[H][N][D], vb[H][N][D];
    for (int h = 0; h < H; h++)
        for (int n = 0; n < N; n++)
            for (int d = 0; d < D; d++) {
                kh[h][n][d] = kvs_f32_to_f16(K[0][h][n][d]);
                vb[h][n][d] = kvs_f32_to_bf16(V[0][h][n][d]);
            }
    static float qa[H][N][D];
    kvs_layer one = {.k = kvs_view_make(kh, KVS_F16, H, N, D),
                     .v = kvs_view_make(vb, KVS_BF16, H, N, D),
                     .q = kvs_view_make(qa, KVS_F32, H, N, D)};
    kvs_cache_view c1 = {1, &one, NULL};
    CHECK_OK(kvs_cache_validate(&c1, &s, e), e);
    CHECK_EQ_INT(s.n_queries, N);
    kh[1][7][2] = 0x7c00;
    CHECK_FAILS(kvs_cache_validate(&c1, &s, e), KVS_ERR_NUMERIC, e, "layer 0: K head 1 token 7 channel 2 is +Inf");
    kh[1][7][2] = 0;
    vb[0][19][3] = 0xffc0;
    CHECK_FAILS(kvs_cache_validate(&c1, &s, e), KVS_ERR_NUMERIC, e, "layer 0: V head 0 token 19 channel 3 is NaN");
}

static void test_errors(void) {
    kvs_shape s;
    kvs_cache_view c = make_cache(1);
    K[0][1][17][3] = NAN;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_NUMERIC, e, "layer 0: K head 1 token 17 channel 3 is NaN");
    c = make_cache(1);
    V[2][0][3][1] = INFINITY;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_NUMERIC, e, "layer 2: V head 0 token 3 channel 1 is +Inf");
    c = make_cache(1);
    Q[1][3][4][0] = -INFINITY;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_NUMERIC, e, "layer 1: Q head 3 token 4 channel 0 is -Inf");

    c = make_cache(1);
    layers[2].v.n_heads = 1;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 2: K has 2 heads but V has 1");
    c = make_cache(1);
    layers[1].v.n_tokens = 19;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 1: K has N = 20 tokens but V has 19");
    c = make_cache(1);
    layers[0].v.head_dim = 3;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: K has head_dim 4 but V has 3");
    c = make_cache(1);
    layers[2].k.n_tokens = layers[2].v.n_tokens = 19;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 2: N = 19 but layer 0 has N = 20");
    c = make_cache(1);
    layers[1].k.n_heads = layers[1].v.n_heads = 1;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 1: 1 KV heads but layer 0 has 2");
    c = make_cache(1);
    for (int l = 0; l < L; l++) layers[l].k.n_tokens = layers[l].v.n_tokens = 0;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: N = 0");
    c = make_cache(1);
    layers[0].k.data = NULL;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: K has no data");
    c = make_cache(1);
    layers[1].v.dtype = KVS_I32;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 1: V has dtype I32");
    c = make_cache(1);
    layers[0].k.s_tok = 2;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: K token stride 2");
    c = make_cache(1);
    for (int l = 0; l < L; l++) layers[l].q.n_heads = 3;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: Q has 3 heads, not a multiple of the 2 KV heads");
    c = make_cache(1);
    layers[0].q.n_tokens = 21;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: Q has Nq = 21 rows but N = 20");
    c = make_cache(1);
    layers[2].q.n_tokens = 4;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 2: Q has Nq = 4 rows but layer 0 has 5");
    c = make_cache(1);
    layers[1].q.data = NULL;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 1 has no queries but layer 0 has them");
    c = make_cache(0);
    layers[2].q = kvs_view_make(Q[2], KVS_F32, HQ, NQ, D);
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 2 has queries but layer 0 has none");
    c = make_cache(1);
    layers[0].q.head_dim = 2;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: Q has head_dim 2 but K has 4");
    c = make_cache(1);
    layers[0].q.n_tokens = 0;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "layer 0: Q has Nq = 0");
    c = make_cache(1);
    modality[13] = 9;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "modality[13] = 9");
    c = make_cache(1);
    c.n_layers = 0;
    CHECK_FAILS(kvs_cache_validate(&c, &s, e), KVS_ERR_INVALID, e, "0 layers");
    CHECK_FAILS(kvs_cache_validate(NULL, &s, e), KVS_ERR_INVALID, e, "NULL");
}

static void test_dense(void) {
    kvs_dense_cache dc;
    memset(&dc, 0, sizeof dc);
    dc.n_layers = 2;
    dc.n_tokens = 6;
    dc.layers = calloc(2, sizeof *dc.layers);
    dc.modality = calloc(6, 1);
    dc.modality[3] = KVS_MOD_IMAGE;
    for (int l = 0; l < 2; l++) {
        kvs_dense_layer *d = &dc.layers[l];
        d->n_tokens = 6;
        d->n_kv_heads = 2;
        d->head_dim = 3;
        d->k = calloc(2 * 6 * 3, sizeof(float)); /* [2][6][3] */
        d->v = calloc(2 * 6 * 3, sizeof(float));
        d->n_q_heads = 4;
        d->n_queries = 2;
        d->q = calloc(4 * 2 * 3, sizeof(float)); /* [4][2][3] */
        for (int i = 0; i < 36; i++) d->k[i] = (float)(l * 100 + i);
    }
    kvs_cache_view v;
    kvs_layer st[2];
    CHECK_OK(kvs_dense_cache_view(&dc, &v, st, e), e);
    CHECK_EQ_INT(v.n_layers, 2);
    CHECK(v.layers == st && v.modality == dc.modality);
    kvs_shape s;
    CHECK_OK(kvs_cache_validate(&v, &s, e), e);
    CHECK_EQ_INT(s.n_tokens, 6);
    CHECK_EQ_INT(s.n_q_heads, 4);
    CHECK_EQ_INT(s.n_queries, 2);
    float row[3];
    kvs_view_rows_f32(&st[1].k, 1, 2, 1, row);
    CHECK(row[0] == 100 + 6 * 3 + 2 * 3);
    dc.layers[1].n_tokens = 3; /* compressed layer */
    CHECK_FAILS(kvs_dense_cache_view(&dc, &v, st, e), KVS_ERR_INVALID, e, "layer 1: holds 3 tokens but the prompt had N = 6");
    kvs_dense_cache_free(&dc);
    CHECK(dc.layers == NULL && dc.modality == NULL && dc.n_layers == 0);
    kvs_dense_cache_free(&dc); /* harmless twice */
}

/* kvs_cache_check_finite on 1-5 threads: several bad values at once, the
 * message always names the first in (layer, K|V|Q, head, token) order; only
 * the last q_rows query rows are scanned. */
static void test_finite_threads(void) {
    for (int t = 1; t <= 5; t++) {
        kvs_cache_view c = make_cache(1);
        CHECK_OK(kvs_cache_check_finite(&c, NQ, t, e), e);
        V[2][1][0][0] = NAN;
        Q[1][0][4][1] = INFINITY;
        V[1][1][9][2] = -INFINITY;
        K[1][1][3][0] = NAN; /* first in order: layer 1, K before V and Q */
        CHECK_FAILS(kvs_cache_check_finite(&c, NQ, t, e), KVS_ERR_NUMERIC, e,
                    "layer 1: K head 1 token 3 channel 0 is NaN");
        K[1][1][3][0] = 0;
        CHECK_FAILS(kvs_cache_check_finite(&c, NQ, t, e), KVS_ERR_NUMERIC, e,
                    "layer 1: V head 1 token 9 channel 2 is -Inf");
        V[1][1][9][2] = 0;
        CHECK_FAILS(kvs_cache_check_finite(&c, NQ, t, e), KVS_ERR_NUMERIC, e,
                    "layer 1: Q head 0 token 4 channel 1 is +Inf");
        /* q_rows = 0: queries not read; the V of layer 2 is next */
        CHECK_FAILS(kvs_cache_check_finite(&c, 0, t, e), KVS_ERR_NUMERIC, e,
                    "layer 2: V head 1 token 0 channel 0 is NaN");
        V[2][1][0][0] = 0;
        /* a bad query row outside the last 2 rows is not read; inside it is,
         * and the token counts within the scanned rows */
        CHECK_OK(kvs_cache_check_finite(&c, 0, t, e), e);
        Q[1][0][4][1] = 0;
        Q[0][2][1][3] = NAN;
        CHECK_OK(kvs_cache_check_finite(&c, 2, t, e), e);
        CHECK_FAILS(kvs_cache_check_finite(&c, 4, t, e), KVS_ERR_NUMERIC, e,
                    "layer 0: Q head 2 token 0 channel 3 is NaN");
        CHECK_FAILS(kvs_cache_check_finite(&c, 99, t, e), KVS_ERR_NUMERIC, e,
                    "layer 0: Q head 2 token 1 channel 3 is NaN");
    }
}

int main(void) {
    test_valid();
    test_errors();
    test_dense();
    test_finite_threads();
    return kvs_test_finish("core_cache");
}
