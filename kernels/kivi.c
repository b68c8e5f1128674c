/*
 * kivi.c -- the KIVI-style quantised store of one KV head (kivi.h is its
 * manual): group quantisation with fp16 zero points and scales, the bit
 * packing, the full-precision windows, and attention reads on the codes.
 * Not here: any model, method or GPU code.
 */
#include "kivi.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

struct kvs_kivi_head {
    kvs_kivi_config cfg;
    int d, cap;
    int n, kq, vq;       /* tokens; quantised key / value prefixes */
    size_t kblk_bytes;   /* packed codes of one key block (G tokens x d) */
    size_t vrow_bytes;   /* packed codes of one value row */
    int vgroups;         /* ceil(d / G) */
    size_t wsz;          /* bytes of one window element */
    uint8_t *kcode;      /* [cap / G][kblk_bytes] */
    uint16_t *kscale;    /* [cap / G][d] fp16 */
    uint16_t *kzero;     /* [cap / G][d] fp16 */
    uint8_t *vcode;      /* [cap][vrow_bytes] */
    uint16_t *vscale;    /* [cap][vgroups] fp16 */
    uint16_t *vzero;     /* [cap][vgroups] fp16 */
    uint8_t *kwin;       /* [R][d]: key t at row t - kq */
    uint8_t *vwin;       /* [R + 1][d] ring: value t at row t % (R + 1) */
    float *tile;         /* [2][G][max(d, 2)] scratch of the flushes and reads */
    float *rows;         /* [2][d] the K and V rows being appended */
};

#define KIVI_FP16_MAX 65504.0f

/* ---- fp16 rounding towards -inf / +inf ----------------------------------- */

static uint16_t f16_next_down(uint16_t h) {
    if (h == 0x0000u || h == 0x8000u) return 0x8001u; /* +-0 -> -smallest subnormal */
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}
static uint16_t f16_next_up(uint16_t h) {
    if (h == 0x0000u || h == 0x8000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}
static uint16_t f16_round_down(float x) {
    uint16_t h = kvs_f32_to_f16(x);
    return kvs_f16_to_f32(h) > x ? f16_next_down(h) : h;
}
static uint16_t f16_round_up(float x) {
    uint16_t h = kvs_f32_to_f16(x);
    return kvs_f16_to_f32(h) < x ? f16_next_up(h) : h;
}

/* ---- bit packing ---------------------------------------------------------- */

static inline void put_code(uint8_t *buf, size_t i, int bits, unsigned code) {
    const size_t bit = i * (size_t)bits;
    const unsigned sh = (unsigned)(bit & 7u);
    const unsigned mask = (1u << bits) - 1u;
    uint8_t *p = buf + (bit >> 3);
    *p = (uint8_t)((*p & ~(mask << sh)) | ((code & mask) << sh));
}
static inline unsigned get_code(const uint8_t *buf, size_t i, int bits) {
    const size_t bit = i * (size_t)bits;
    return (buf[bit >> 3] >> (bit & 7u)) & ((1u << bits) - 1u);
}

/* Quantises x[j * stride], j < m, into codes [first, first + m) of buf. */
static void quant_group(const float *x, int m, size_t stride, int bits, uint8_t *buf,
                        size_t first, uint16_t *scale, uint16_t *zero) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < m; j++) {
        const float v = x[(size_t)j * stride];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    const float qmax = (float)((1 << bits) - 1);
    const uint16_t z16 = f16_round_down(mn);
    const float z = kvs_f16_to_f32(z16);
    const uint16_t s16 = mx > z ? f16_round_up((mx - z) / qmax) : 0;
    const float s = kvs_f16_to_f32(s16);
    for (int j = 0; j < m; j++) {
        unsigned code = 0;
        if (s > 0.0f) {
            const float r = floorf((x[(size_t)j * stride] - z) / s + 0.5f);
            code = r <= 0.0f ? 0u : r >= qmax ? (unsigned)qmax : (unsigned)r;
        }
        put_code(buf, first + (size_t)j, bits, code);
    }
    *scale = s16;
    *zero = z16;
}

/* ---- window rows ----------------------------------------------------------- */

static void win_put(const kvs_kivi_head *h, uint8_t *row, const float *x) {
    const int d = h->d;
    switch (h->cfg.residual_dtype) {
    case KVS_F32: memcpy(row, x, (size_t)d * sizeof(float)); break;
    case KVS_F16:
        for (int c = 0; c < d; c++) ((uint16_t *)(void *)row)[c] = kvs_f32_to_f16(x[c]);
        break;
    default:
        for (int c = 0; c < d; c++) ((uint16_t *)(void *)row)[c] = kvs_f32_to_bf16(x[c]);
        break;
    }
}
static void win_get(const kvs_kivi_head *h, const uint8_t *row, float *x) {
    const int d = h->d;
    switch (h->cfg.residual_dtype) {
    case KVS_F32: memcpy(x, row, (size_t)d * sizeof(float)); break;
    case KVS_F16: {
        int c = 0;
#if defined(__F16C__)
        for (; c + 8 <= d; c += 8) /* exact conversions, as kvs_f16_to_f32 */
            _mm256_storeu_ps(x + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * c))));
#endif
        for (; c < d; c++) x[c] = kvs_f16_to_f32(((const uint16_t *)(const void *)row)[c]);
        break;
    }
    default:
        for (int c = 0; c < d; c++) x[c] = kvs_bf16_to_f32(((const uint16_t *)(const void *)row)[c]);
        break;
    }
}
static const uint8_t *kwin_row(const kvs_kivi_head *h, int t) {
    return h->kwin + (size_t)(t - h->kq) * (size_t)h->d * h->wsz;
}
static const uint8_t *vwin_row(const kvs_kivi_head *h, int t) {
    return h->vwin + (size_t)(t % (h->cfg.residual + 1)) * (size_t)h->d * h->wsz;
}

/* ---- quantising the windows ------------------------------------------------ */

/* The key window holds exactly R tokens: quantise them as R / G blocks. */
static void flush_keys(kvs_kivi_head *h) {
    const int G = h->cfg.group, d = h->d;
    for (int b0 = 0; b0 < h->cfg.residual; b0 += G) {
        for (int j = 0; j < G; j++) win_get(h, kwin_row(h, h->kq + b0 + j), h->tile + (size_t)j * d);
        const size_t blk = (size_t)((h->kq + b0) / G);
        uint8_t *codes = h->kcode + blk * h->kblk_bytes;
        for (int c = 0; c < d; c++)
            quant_group(h->tile + c, G, (size_t)d, h->cfg.k_bits, codes, (size_t)c * G,
                        h->kscale + blk * d + c, h->kzero + blk * d + c);
    }
    h->kq += h->cfg.residual;
}

/* Quantise the oldest value of the window (token vq). */
static void flush_value(kvs_kivi_head *h) {
    const int G = h->cfg.group, d = h->d, t = h->vq;
    win_get(h, vwin_row(h, t), h->tile);
    uint8_t *codes = h->vcode + (size_t)t * h->vrow_bytes;
    for (int g = 0; g < h->vgroups; g++) {
        const int c0 = g * G, m = d - c0 < G ? d - c0 : G;
        quant_group(h->tile + c0, m, 1, h->cfg.v_bits, codes, (size_t)c0,
                    h->vscale + (size_t)t * h->vgroups + g, h->vzero + (size_t)t * h->vgroups + g);
    }
    h->vq++;
}

void kvs_kivi_flush(kvs_kivi_head *h) {
    if (h->n - h->kq == h->cfg.residual) flush_keys(h);
    while (h->n - h->vq > h->cfg.residual) flush_value(h);
}

/* One token, its rows already checked. */
static void push(kvs_kivi_head *h, const float *krow, const float *vrow) {
    if (h->n - h->kq == h->cfg.residual) flush_keys(h);
    while (h->n - h->vq > h->cfg.residual) flush_value(h);
    const size_t rb = (size_t)h->d * h->wsz;
    win_put(h, h->kwin + (size_t)(h->n - h->kq) * rb, krow);
    win_put(h, h->vwin + (size_t)(h->n % (h->cfg.residual + 1)) * rb, vrow);
    h->n++;
}

/* ---- config, init, free ---------------------------------------------------- */

kvs_kivi_config kvs_kivi_config_default(int bits) {
    kvs_kivi_config c = {bits, bits, KVS_KIVI_GROUP, KVS_KIVI_RESIDUAL, KVS_F16};
    return c;
}

kvs_status kvs_kivi_config_check(const kvs_kivi_config *cfg, int head_dim, kvs_err *err) {
    if (!cfg) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: config is NULL");
    if (cfg->k_bits != 2 && cfg->k_bits != 4)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: k_bits = %d (2 or 4)", cfg->k_bits);
    if (cfg->v_bits != 2 && cfg->v_bits != 4)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: v_bits = %d (2 or 4)", cfg->v_bits);
    if (cfg->group < 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: group = %d (>= 1)", cfg->group);
    if (cfg->residual < cfg->group || cfg->residual % cfg->group != 0)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kivi: residual = %d must be a positive multiple of group = %d",
                          cfg->residual, cfg->group);
    if (cfg->residual_dtype != KVS_F32 && cfg->residual_dtype != KVS_F16 &&
        cfg->residual_dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: residual_dtype %d (F32, F16 or BF16)",
                          (int)cfg->residual_dtype);
    if (head_dim < 1) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: head_dim = %d", head_dim);
    return KVS_OK;
}

void kvs_kivi_free(kvs_kivi_head *h) {
    if (!h) return;
    free(h->kcode);
    free(h->kscale);
    free(h->kzero);
    free(h->vcode);
    free(h->vscale);
    free(h->vzero);
    free(h->kwin);
    free(h->vwin);
    free(h->tile);
    free(h->rows);
    free(h);
}

kvs_status kvs_kivi_init(kvs_kivi_head **out, const kvs_kivi_config *cfg, int head_dim,
                         int capacity, kvs_err *err) {
    if (!out) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: out is NULL");
    *out = NULL;
    kvs_status st = kvs_kivi_config_check(cfg, head_dim, err);
    if (st) return st;
    if (capacity < 1) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: capacity = %d", capacity);
    kvs_kivi_head *h = calloc(1, sizeof *h);
    if (!h) return kvs_errorf(err, KVS_ERR_NOMEM, "kivi: store");
    const int G = cfg->group, R = cfg->residual, d = head_dim;
    const size_t nblk = (size_t)(capacity / G) + 1, cap = (size_t)capacity;
    h->cfg = *cfg;
    h->d = d;
    h->cap = capacity;
    h->kblk_bytes = ((size_t)d * G * cfg->k_bits + 7) / 8;
    h->vrow_bytes = ((size_t)d * cfg->v_bits + 7) / 8;
    h->vgroups = (d + G - 1) / G;
    h->wsz = kvs_dtype_size(cfg->residual_dtype);
    h->kcode = calloc(nblk, h->kblk_bytes);
    h->kscale = calloc(nblk * d, sizeof(uint16_t));
    h->kzero = calloc(nblk * d, sizeof(uint16_t));
    h->vcode = calloc(cap, h->vrow_bytes);
    h->vscale = calloc(cap * h->vgroups, sizeof(uint16_t));
    h->vzero = calloc(cap * h->vgroups, sizeof(uint16_t));
    h->kwin = calloc((size_t)R * d, h->wsz);
    h->vwin = calloc((size_t)(R + 1) * d, h->wsz);
    h->tile = calloc((size_t)2 * G * (d > 2 ? d : 2), sizeof(float)); /* 2 tiles; score_block: 2 G */
    h->rows = calloc(2 * (size_t)d, sizeof(float));
    if (!h->kcode || !h->kscale || !h->kzero || !h->vcode || !h->vscale || !h->vzero ||
        !h->kwin || !h->vwin || !h->tile || !h->rows) {
        kvs_kivi_free(h);
        return kvs_errorf(err, KVS_ERR_NOMEM, "kivi: %d tokens x %d channels", capacity, d);
    }
    *out = h;
    return KVS_OK;
}

void kvs_kivi_reset(kvs_kivi_head *h) { h->n = h->kq = h->vq = 0; }

/* ---- appending ------------------------------------------------------------- */

static kvs_status check_view(const kvs_kivi_head *h, const kvs_view *v, const char *what,
                             int head, kvs_err *err) {
    if (!v || !v->data) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: %s view is NULL", what);
    if (v->device != KVS_HOST)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "kivi: %s view is not in host memory", what);
    if (v->dtype != KVS_F32 && v->dtype != KVS_F16 && v->dtype != KVS_BF16)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: %s view dtype %s", what,
                          kvs_dtype_name(v->dtype));
    if (v->head_dim != h->d)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: %s view head_dim %d, store %d", what,
                          v->head_dim, h->d);
    if (head < 0 || head >= v->n_heads)
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: head %d of %s (%d heads)", head, what,
                          v->n_heads);
    return KVS_OK;
}

static kvs_status check_row(const float *x, int d, const char *what, int head, int tok,
                            kvs_err *err) {
    for (int c = 0; c < d; c++)
        if (!(fabsf(x[c]) <= KIVI_FP16_MAX))
            return kvs_errorf(err, KVS_ERR_NUMERIC,
                              "kivi: %s head %d token %d channel %d: %g is NaN, Inf or beyond "
                              "+-65504 (fp16 zero points)",
                              what, head, tok, c, (double)x[c]);
    return KVS_OK;
}

/* Rows rows[i] (or n0 + i when rows is NULL), i < count, of both views. */
static kvs_status append_impl(kvs_kivi_head *h, const kvs_view *k, const kvs_view *v, int head,
                              int n0, const int32_t *rows, int count, kvs_err *err) {
    kvs_status st = check_view(h, k, "K", head, err);
    if (!st) st = check_view(h, v, "V", head, err);
    if (st) return st;
    if (count < 0) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: count = %d", count);
    if (count > h->cap - h->n)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "kivi: appending %d tokens to %d exceeds the capacity %d", count, h->n,
                          h->cap);
    const int N = k->n_tokens < v->n_tokens ? k->n_tokens : v->n_tokens;
    if (!rows && (n0 < 0 || n0 > N - count))
        return kvs_errorf(err, KVS_ERR_INVALID, "kivi: rows [%d, %d) of %d tokens", n0,
                          n0 + count, N);
    for (int i = 0; rows && i < count; i++)
        if (rows[i] < 0 || rows[i] >= N || (i > 0 && rows[i] <= rows[i - 1]))
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "kivi: idx[%d] = %d: indices must ascend strictly within [0, %d)",
                              i, rows[i], N);
    /* Check every row first, so a failure leaves the store unchanged. */
    float *kr = h->rows, *vr = h->rows + h->d;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < count; i++) {
            const int t = rows ? rows[i] : n0 + i;
            kvs_view_rows_f32(k, head, t, 1, kr);
            kvs_view_rows_f32(v, head, t, 1, vr);
            if (pass == 1) {
                push(h, kr, vr);
                continue;
            }
            st = check_row(kr, h->d, "K", head, t, err);
            if (!st) st = check_row(vr, h->d, "V", head, t, err);
            if (st) return st;
        }
    return KVS_OK;
}

kvs_status kvs_kivi_append(kvs_kivi_head *h, const kvs_view *k, const kvs_view *v, int head,
                           int n0, int count, kvs_err *err) {
    if (!h) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: store is NULL");
    return append_impl(h, k, v, head, n0, NULL, count, err);
}

kvs_status kvs_kivi_append_rows(kvs_kivi_head *h, const kvs_view *k, const kvs_view *v,
                                int head, const int32_t *idx, int n, kvs_err *err) {
    if (!h) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: store is NULL");
    if (!idx && n > 0) return kvs_errorf(err, KVS_ERR_INVALID, "kivi: idx is NULL");
    return append_impl(h, k, v, head, 0, idx, n, err);
}

/* ---- reading ---------------------------------------------------------------- */

/* The 2^bits values z + code * s of one group (the same fp32 expression for
 * every read, so every read path gives identical values). */
static void group_lut(uint16_t s16, uint16_t z16, int bits, float *lut) {
    const float s = kvs_f16_to_f32(s16), z = kvs_f16_to_f32(z16);
    for (int q = 0; q < (1 << bits); q++) lut[q] = z + (float)q * s;
}

/* Key block b (tokens b G .. b G + G - 1) dequantised into tile [G][d]. */
static void key_block(const kvs_kivi_head *h, int b, float *tile) {
    const int G = h->cfg.group, d = h->d, bits = h->cfg.k_bits;
    const uint8_t *codes = h->kcode + (size_t)b * h->kblk_bytes;
    const uint16_t *sc = h->kscale + (size_t)b * d, *zr = h->kzero + (size_t)b * d;
    float lut[16];
    for (int c = 0; c < d; c++) {
        group_lut(sc[c], zr[c], bits, lut);
        for (int j = 0; j < G; j++) tile[(size_t)j * d + c] = lut[get_code(codes, (size_t)c * G + j, bits)];
    }
}

/* Codes [first, first + m) of buf as floats. Where they start at a byte
 * (first * bits a multiple of 8) and bits is 2 or 4, whole bytes are
 * unpacked in loops the compiler vectorises; get_code's values either way. */
static void codes_f32(const uint8_t *buf, size_t first, int m, int bits, float *out) {
    const size_t bit = first * (size_t)bits;
    const uint8_t *p = buf + (bit >> 3);
    int j = 0;
    if ((bit & 7u) == 0 && bits == 4)
        for (; j + 2 <= m; j += 2) {
            out[j] = (float)(p[j >> 1] & 15u);
            out[j + 1] = (float)(p[j >> 1] >> 4);
        }
    else if ((bit & 7u) == 0 && bits == 2)
        for (; j + 4 <= m; j += 4) {
            const unsigned x = p[j >> 2];
            out[j] = (float)(x & 3u);
            out[j + 1] = (float)((x >> 2) & 3u);
            out[j + 2] = (float)((x >> 4) & 3u);
            out[j + 3] = (float)(x >> 6);
        }
    for (; j < m; j++) out[j] = (float)get_code(buf, first + (size_t)j, bits);
}

/* Quantised value t dequantised into row [d]: z + code * s, group_lut's
 * expression, so the same values as every other read. */
static void value_row(const kvs_kivi_head *h, int t, float *row) {
    const int G = h->cfg.group, d = h->d, bits = h->cfg.v_bits;
    const uint8_t *codes = h->vcode + (size_t)t * h->vrow_bytes;
    const uint16_t *sc = h->vscale + (size_t)t * h->vgroups, *zr = h->vzero + (size_t)t * h->vgroups;
    for (int g = 0, c0 = 0; g < h->vgroups; g++, c0 += G) {
        const float s = kvs_f16_to_f32(sc[g]), z = kvs_f16_to_f32(zr[g]);
        const int c1 = d - c0 < G ? d : c0 + G;
        codes_f32(codes, (size_t)c0, c1 - c0, bits, row + c0);
        for (int c = c0; c < c1; c++) row[c] = z + row[c] * s;
    }
}

static float dot(const float *a, const float *b, int d) {
    float acc = 0.0f;
    for (int c = 0; c < d; c++) acc += a[c] * b[c];
    return acc;
}

/* scores[i][t0 + j] for the m rows of tile, every query. */
static void score_rows(const kvs_kivi_head *h, const float *q, int nq, const float *tile, int m,
                       int t0, float *scores) {
    const int d = h->d;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < m; j++)
            scores[(size_t)i * h->n + t0 + j] = dot(q + (size_t)i * d, tile + (size_t)j * d, d);
}

#if defined(__AVX2__)
/* Codes j0 .. j0 + 7 of a byte-aligned run p of 2- or 4-bit codes as 8
 * floats (get_code's values). */
static inline __m256 codes8(const uint8_t *p, int j0, int bits) {
    uint32_t x;
    __m256i sh, mask;
    if (bits == 4) {
        memcpy(&x, p + (j0 >> 1), 4);
        sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        mask = _mm256_set1_epi32(15);
    } else {
        uint16_t y;
        memcpy(&y, p + (j0 >> 2), 2);
        x = y;
        sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        mask = _mm256_set1_epi32(3);
    }
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)x), sh), mask));
}
#endif

/* The vector paths: runs of 8 codes that start at a byte (G a multiple of 8,
 * 2 or 4 bits). Their arithmetic is the scalar code's, lane by lane (a
 * product, then a sum: no fused multiply-add, as the C11 build's). */
static int fast_ok(int G, int bits) {
#if defined(__AVX2__)
    return G % 8 == 0 && (bits == 2 || bits == 4);
#else
    (void)G;
    (void)bits;
    return 0;
#endif
}

#if defined(__AVX2__)
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); } /* exact, as kvs_f16_to_f32 */

/* Tokens j .. j + 8 nv - 1 (nv 1 or 2) of key block b against ni <= 4
 * queries (q [ni][d]): 8 nv x ni sums in registers, each over the channels in
 * order, written to scores[i][j ..] (row stride h->n). */
static inline __attribute__((always_inline)) void score_cols(const kvs_kivi_head *h, int b, const float *q, int ni,
                                                             int j, int nv, float *scores) {
    const int G = h->cfg.group, d = h->d, bits = h->cfg.k_bits;
    const size_t cb = (size_t)G * bits / 8; /* bytes of one channel's codes */
    const uint8_t *codes = h->kcode + (size_t)b * h->kblk_bytes;
    const uint16_t *sc = h->kscale + (size_t)b * d, *zr = h->kzero + (size_t)b * d;
    __m256 acc[2][4];
    #pragma GCC unroll 2
    for (int v = 0; v < 2; v++)
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) acc[v][i] = _mm256_setzero_ps();
    for (int c = 0; c < d; c++) {
        const __m256 s = _mm256_set1_ps(h2f(sc[c])), z = _mm256_set1_ps(h2f(zr[c]));
        const uint8_t *p = codes + (size_t)c * cb;
        #pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            const __m256 k = _mm256_add_ps(z, _mm256_mul_ps(codes8(p, j + 8 * v, bits), s));
            #pragma GCC unroll 4
            for (int i = 0; i < ni; i++)
                acc[v][i] = _mm256_add_ps(acc[v][i], _mm256_mul_ps(_mm256_set1_ps(q[(size_t)i * d + c]), k));
        }
    }
    #pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
        #pragma GCC unroll 4
        for (int i = 0; i < ni; i++) _mm256_storeu_ps(scores + (size_t)i * h->n + j + 8 * v, acc[v][i]);
}

/* out[i][c0 .. c0 + 8 nv - 1] += sum over the quantised values t < vq of
 * w[i][t] v_t, ni <= 4 queries (w [ni][T], out [ni][d]), t in order: the
 * scalar loop's sums, 8 nv x ni of them in registers. */
static inline __attribute__((always_inline)) void wsum_cols(const kvs_kivi_head *h, const float *w, int ni, int c0,
                                                            int nv, float *out) {
    const int G = h->cfg.group, d = h->d, bits = h->cfg.v_bits, T = h->n;
    __m256 acc[2][4];
    #pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
        #pragma GCC unroll 4
        for (int i = 0; i < ni; i++) acc[v][i] = _mm256_loadu_ps(out + (size_t)i * d + c0 + 8 * v);
    const int g0 = c0 / G, g1 = (c0 + 8) / G;
    for (int t = 0; t < h->vq; t++) {
        const uint8_t *codes = h->vcode + (size_t)t * h->vrow_bytes;
        const uint16_t *sc = h->vscale + (size_t)t * h->vgroups, *zr = h->vzero + (size_t)t * h->vgroups;
        #pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            const int g = v ? g1 : g0;
            const __m256 s = _mm256_set1_ps(h2f(sc[g])), z = _mm256_set1_ps(h2f(zr[g]));
            const __m256 x = _mm256_add_ps(z, _mm256_mul_ps(codes8(codes, c0 + 8 * v, bits), s));
            #pragma GCC unroll 4
            for (int i = 0; i < ni; i++)
                acc[v][i] = _mm256_add_ps(acc[v][i], _mm256_mul_ps(_mm256_set1_ps(w[(size_t)i * T + t]), x));
        }
    }
    #pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
        #pragma GCC unroll 4
        for (int i = 0; i < ni; i++) _mm256_storeu_ps(out + (size_t)i * d + c0 + 8 * v, acc[v][i]);
}
#endif

#if defined(__AVX2__)
/* The first 8 floor(m / 8) of the m window rows in tile (scores[i][t0 + j]):
 * the rows transposed into the second tile, then 8 tokens x up to 4 queries
 * in registers, each sum over the channels in dot()'s order. Returns how many
 * rows it scored. */
static int window_scores(const kvs_kivi_head *h, const float *q, int nq, int m, int t0, float *scores) {
    const int d = h->d, m8 = m / 8 * 8;
    if (m8 == 0) return 0;
    const float *tile = h->tile;
    float *kt = h->tile + (size_t)h->cfg.group * (d > 2 ? d : 2); /* [d][m] */
    for (int j = 0; j < m; j++)
        for (int c = 0; c < d; c++) kt[(size_t)c * m + j] = tile[(size_t)j * d + c];
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const int ni = nq - i0 < 4 ? nq - i0 : 4;
        for (int j = 0; j < m8; j += 8) {
            __m256 acc[4];
            for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
            for (int c = 0; c < d; c++) {
                const __m256 k = _mm256_loadu_ps(kt + (size_t)c * m + j);
                for (int i = 0; i < ni; i++)
                    acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_set1_ps(q[(size_t)(i0 + i) * d + c]), k));
            }
            for (int i = 0; i < ni; i++) _mm256_storeu_ps(scores + (size_t)(i0 + i) * h->n + t0 + j, acc[i]);
        }
    }
    return m8;
}
#endif

/* scores[i][b G + j], j < G, of key block b without a [G][d] tile: one
 * channel at a time (its G values z + code * s), every (query, token) sum
 * over the channels in dot()'s order, so dot()'s numbers. tile holds 2 G floats. */
static void score_block(const kvs_kivi_head *h, int b, const float *q, int nq, float *tile, float *scores) {
    const int G = h->cfg.group, d = h->d, bits = h->cfg.k_bits;
    const uint8_t *codes = h->kcode + (size_t)b * h->kblk_bytes;
    const uint16_t *sc = h->kscale + (size_t)b * d, *zr = h->kzero + (size_t)b * d;
    float *cf = tile, *kv = tile + G;
    for (int i = 0; i < nq; i++) memset(scores + (size_t)i * h->n + (size_t)b * G, 0, sizeof(float) * (size_t)G);
#if defined(__AVX2__)
    if (fast_ok(G, bits)) {
        for (int i0 = 0; i0 < nq; i0 += 4)
            for (int j = 0; j < G; j += 16) {
                const float *qi = q + (size_t)i0 * d;
                float *si = scores + (size_t)i0 * h->n + (size_t)b * G;
                /* constant counts: the accumulators stay in registers */
#define KIVI_SCORE_CASES(NV)                                                   \
    switch (nq - i0 < 4 ? nq - i0 : 4) {                                       \
    case 4: score_cols(h, b, qi, 4, j, NV, si); break;                         \
    case 3: score_cols(h, b, qi, 3, j, NV, si); break;                         \
    case 2: score_cols(h, b, qi, 2, j, NV, si); break;                         \
    default: score_cols(h, b, qi, 1, j, NV, si); break;                        \
    }
                if (G - j >= 16) {
                    KIVI_SCORE_CASES(2)
                } else {
                    KIVI_SCORE_CASES(1)
                }
#undef KIVI_SCORE_CASES
            }
        return;
    }
#endif
    for (int c = 0; c < d; c++) {
        const float s = kvs_f16_to_f32(sc[c]), z = kvs_f16_to_f32(zr[c]);
        codes_f32(codes, (size_t)c * G, G, bits, cf);
        for (int j = 0; j < G; j++) kv[j] = z + cf[j] * s;
        for (int i = 0; i < nq; i++) {
            const float qc = q[(size_t)i * d + c];
            float *o = scores + (size_t)i * h->n + (size_t)b * G;
            for (int j = 0; j < G; j++) o[j] += qc * kv[j];
        }
    }
}

static kvs_status check_read(const kvs_kivi_head *h, const void *a, const void *b, int nq,
                             const char *fn, kvs_err *err) {
    if (!h || !a || !b) return kvs_errorf(err, KVS_ERR_INVALID, "%s: NULL argument", fn);
    if (nq < 1) return kvs_errorf(err, KVS_ERR_INVALID, "%s: nq = %d", fn, nq);
    if (h->n == 0) return kvs_errorf(err, KVS_ERR_INVALID, "%s: the store is empty", fn);
    return KVS_OK;
}

kvs_status kvs_kivi_scores(kvs_kivi_head *h, const float *q, int nq, float *scores,
                           kvs_err *err) {
    kvs_status st = check_read(h, q, scores, nq, "kvs_kivi_scores", err);
    if (st) return st;
    const int G = h->cfg.group, d = h->d;
    for (int b = 0; b < h->kq / G; b++) score_block(h, b, q, nq, h->tile, scores);
    for (int t0 = h->kq; t0 < h->n; t0 += G) { /* the window, G rows at a time */
        const int m = h->n - t0 < G ? h->n - t0 : G;
        for (int j = 0; j < m; j++) win_get(h, kwin_row(h, t0 + j), h->tile + (size_t)j * d);
        int j8 = 0;
#if defined(__AVX2__)
        j8 = window_scores(h, q, nq, m, t0, scores);
#endif
        score_rows(h, q, nq, h->tile + (size_t)j8 * d, m - j8, t0 + j8, scores);
    }
    return KVS_OK;
}

kvs_status kvs_kivi_weighted_sum(kvs_kivi_head *h, const float *w, int nq, float *out,
                                 kvs_err *err) {
    kvs_status st = check_read(h, w, out, nq, "kvs_kivi_weighted_sum", err);
    if (st) return st;
    const int d = h->d, T = h->n;
    memset(out, 0, (size_t)nq * d * sizeof(float));
    int t0 = 0;
#if defined(__AVX2__)
    const int G = h->cfg.group, bits = h->cfg.v_bits;
    if (fast_ok(G, bits) && d % 8 == 0 && h->vq > 0) { /* the quantised rows (whole 8-channel runs of a group) */
        for (int i0 = 0; i0 < nq; i0 += 4) {
            const int ni = nq - i0 < 4 ? nq - i0 : 4;
            const float *wi = w + (size_t)i0 * T;
            float *oi = out + (size_t)i0 * d;
            for (int c0 = 0; c0 < d; c0 += 16) {
#define KIVI_WSUM_CASES(NV)                                                    \
    switch (ni) {                                                              \
    case 4: wsum_cols(h, wi, 4, c0, NV, oi); break;                            \
    case 3: wsum_cols(h, wi, 3, c0, NV, oi); break;                            \
    case 2: wsum_cols(h, wi, 2, c0, NV, oi); break;                            \
    default: wsum_cols(h, wi, 1, c0, NV, oi); break;                           \
    }
                if (d - c0 >= 16) {
                    KIVI_WSUM_CASES(2)
                } else {
                    KIVI_WSUM_CASES(1)
                }
#undef KIVI_WSUM_CASES
            }
        }
        t0 = h->vq;
    }
#endif
    for (int t = t0; t < T; t++) {
        if (t < h->vq)
            value_row(h, t, h->tile);
        else
            win_get(h, vwin_row(h, t), h->tile);
        for (int i = 0; i < nq; i++) {
            const float wt = w[(size_t)i * T + t];
            float *o = out + (size_t)i * d;
            int c = 0;
#if defined(__AVX2__)
            for (; c + 8 <= d; c += 8) /* lane by lane the loop below */
                _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c),
                                                      _mm256_mul_ps(_mm256_set1_ps(wt), _mm256_loadu_ps(h->tile + c))));
#endif
            for (; c < d; c++) o[c] += wt * h->tile[c];
        }
    }
    return KVS_OK;
}

void kvs_kivi_dequantize(const kvs_kivi_head *h, float *k, float *v) {
    const int G = h->cfg.group, d = h->d;
    for (int b = 0; b < h->kq / G; b++) key_block(h, b, k + (size_t)b * G * d);
    for (int t = h->kq; t < h->n; t++) win_get(h, kwin_row(h, t), k + (size_t)t * d);
    for (int t = 0; t < h->vq; t++) value_row(h, t, v + (size_t)t * d);
    for (int t = h->vq; t < h->n; t++) win_get(h, vwin_row(h, t), v + (size_t)t * d);
}

float kvs_kivi_step(const kvs_kivi_head *h, int is_value, int t, int c) {
    const int G = h->cfg.group;
    if (is_value)
        return t < h->vq ? kvs_f16_to_f32(h->vscale[(size_t)t * h->vgroups + c / G]) : 0.0f;
    return t < h->kq ? kvs_f16_to_f32(h->kscale[(size_t)(t / G) * h->d + c]) : 0.0f;
}

/* ---- bytes ------------------------------------------------------------------ */

static kvs_kivi_bytes bytes_of(const kvs_kivi_config *cfg, int d, int T, int kq, int vq) {
    const size_t G = (size_t)cfg->group, groups = ((size_t)d + G - 1) / G;
    kvs_kivi_bytes b = {T, kq, vq, 0, 0, 0, 0, 0, 0};
    b.k_codes = (size_t)kq / G * (((size_t)d * G * cfg->k_bits + 7) / 8);
    b.k_params = (size_t)kq / G * d * 2 * sizeof(uint16_t);
    b.v_codes = (size_t)vq * (((size_t)d * cfg->v_bits + 7) / 8);
    b.v_params = (size_t)vq * groups * 2 * sizeof(uint16_t);
    b.window = ((size_t)(T - kq) + (size_t)(T - vq)) * d * kvs_dtype_size(cfg->residual_dtype);
    b.total = b.k_codes + b.k_params + b.v_codes + b.v_params + b.window;
    return b;
}

kvs_kivi_bytes kvs_kivi_stats(const kvs_kivi_head *h) {
    return bytes_of(&h->cfg, h->d, h->n, h->kq, h->vq);
}

kvs_kivi_bytes kvs_kivi_size(const kvs_kivi_config *cfg, int head_dim, int T, int flushed) {
    const int R = cfg->residual;
    int kq = 0, vq = 0;
    if (T > 0) {
        kq = flushed ? R * (T / R) : R * ((T - 1) / R);
        vq = flushed ? T - R : T - R - 1;
        vq = vq > 0 ? vq : 0;
    }
    return bytes_of(cfg, head_dim, T, kq, vq);
}
