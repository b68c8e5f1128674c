/*
 * test_parts_rows.c -- the row reductions of part_rows.c and the threaded
 * linear scorers (knorm, keydiff, lagkv, cur):
 *   - kvs_part_sumsq / kvs_part_dot / kvs_part_sumsq_f64 equal, bit for
 *     bit, a plain loop in the documented lane order (32 fp32 lanes, 16
 *     double lanes, channel t in lane t mod W, folded pairwise), for every
 *     d in [1, 300] (so the AVX path and the tails are both covered), and
 *     are within rounding of the serial sum;
 *   - each scorer's [L][Hkv][N] scores are the same bits with 1, 2 and 3
 *     threads (units of rows / partitions; N = 700 is not a multiple of the
 *     unit or the tile), on an f16 view as well as fp32, layer by layer
 *     (score) and all layers at once (score_layers, which they all have).
 */
#include "kvs_parts.h"
#include "m1_util.h"

#include <math.h>
#include <string.h>

static float ref_f(const float *a, const float *b, int d) {
    float l[32] = {0};
    for (int t = 0; t < d; t++) l[t % 32] += a[t] * b[t];
    for (int w = 16; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

static double ref_d(const float *a, int d) {
    double l[16] = {0};
    for (int t = 0; t < d; t++) l[t % 16] += (double)a[t] * a[t];
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    return l[0];
}

static void rows_exact(void) {
    float a[300], b[300];
    uint64_t rng = 11;
    for (int d = 1; d <= 300; d++) {
        double serial = 0.0;
        for (int t = 0; t < d; t++) {
            a[t] = (float)kvs_rng_normal(&rng) * (1 + d % 5);
            b[t] = (float)kvs_rng_normal(&rng);
            serial += (double)a[t] * a[t];
        }
        const float s = kvs_part_sumsq(a, d), rs = ref_f(a, a, d);
        const float p = kvs_part_dot(a, b, d), rp = ref_f(a, b, d);
        const double s64 = kvs_part_sumsq_f64(a, d), rs64 = ref_d(a, d);
        CHECK_MSG(memcmp(&s, &rs, sizeof s) == 0, "sumsq d=%d: %.9g vs %.9g", d, s, rs);
        CHECK_MSG(memcmp(&p, &rp, sizeof p) == 0, "dot d=%d: %.9g vs %.9g", d, p, rp);
        CHECK_MSG(memcmp(&s64, &rs64, sizeof s64) == 0, "sumsq_f64 d=%d: %.17g vs %.17g", d, s64, rs64);
        CHECK_NEAR(s, serial, 1e-5 * serial);
        CHECK_NEAR(s64, serial, 1e-12 * serial);
    }
}

/* Scores of scorer sc on cache c (views of dtype dt), `threads` workers. */
static void score_with(const kvs_scorer *sc, const kvs_method *m, m1_cache *c, kvs_dtype dt,
                       int threads, int all, float *out) {
    kvs_params p;
    kvs_params_defaults(m, &p);
    kvs_part_ctx ctx = {.m = m, .p = &p, .shape = m1_shape(c, threads)};
    const size_t n = (size_t)c->Hkv * c->N * c->d;
    uint16_t *k16 = malloc(sizeof *k16 * n * c->L), *v16 = malloc(sizeof *v16 * n * c->L);
    kvs_layer *lys = calloc((size_t)c->L, sizeof *lys);
    void *st = NULL;
    kvs_err e = {0};
    CHECK(k16 && v16 && lys && sc->score_layers);
    kvs_status rc = k16 && v16 && lys ? sc->create(&ctx, &st, &e) : KVS_ERR_NOMEM;
    CHECK_MSG(rc == KVS_OK, "%s create: %s", sc->name, e.msg);
    for (int l = 0; l < c->L && !rc; l++) {
        kvs_layer *ly = &lys[l];
        *ly = c->layers[l];
        if (dt == KVS_F16) {
            uint16_t *kl = k16 + n * l, *vl = v16 + n * l;
            for (size_t i = 0; i < n; i++) {
                kl[i] = kvs_f32_to_f16(((const float *)ly->k.data)[i]);
                vl[i] = kvs_f32_to_f16(((const float *)ly->v.data)[i]);
            }
            ly->k = kvs_view_make(kl, KVS_F16, c->Hkv, c->N, c->d);
            ly->v = kvs_view_make(vl, KVS_F16, c->Hkv, c->N, c->d);
        }
        if (!all) {
            rc = sc->score(st, l, ly, out + (size_t)l * c->Hkv * c->N, &e);
            CHECK_MSG(rc == KVS_OK, "%s score layer %d: %s", sc->name, l, e.msg);
        }
    }
    if (!rc && all && sc->score_layers) {
        rc = sc->score_layers(st, lys, c->L, out, &e);
        CHECK_MSG(rc == KVS_OK, "%s score_layers: %s", sc->name, e.msg);
    }
    if (st) sc->destroy(st);
    free(lys);
    free(k16);
    free(v16);
}

static void threads_same(const kvs_scorer *sc, const kvs_method *m) {
    m1_cache c;
    m1_cache_init(&c, 2, 3, 3, 700, 0, 40);
    m1_cache_fill_random(&c, 5);
    const size_t n = (size_t)c.L * c.Hkv * c.N;
    float *a = malloc(sizeof *a * n), *b = malloc(sizeof *b * n);
    CHECK(a && b);
    for (int f = 0; a && b && f < 2; f++) {
        const kvs_dtype dt = f ? KVS_F16 : KVS_F32;
        score_with(sc, m, &c, dt, 1, 0, a);
        for (int t = 1; t <= 3; t++)
            for (int all = t == 1; all < 2; all++) {
                memset(b, 0, sizeof *b * n);
                score_with(sc, m, &c, dt, t, all, b);
                CHECK_MSG(memcmp(a, b, sizeof *a * n) == 0,
                          "%s %s: %d threads, %s differ from 1 thread layer by layer", sc->name,
                          kvs_dtype_name(dt), t, all ? "all layers at once" : "layer by layer");
            }
        for (size_t i = 0; i < n; i++)
            if (!isfinite(a[i])) {
                CHECK_MSG(0, "%s: score %zu is not finite", sc->name, i);
                break;
            }
    }
    free(a);
    free(b);
    m1_cache_free(&c);
}

int main(void) {
    rows_exact();
    threads_same(&kvs_scorer_knorm, &kvs_preset_knorm);
    threads_same(&kvs_scorer_keydiff, &kvs_preset_keydiff);
    threads_same(&kvs_scorer_lagkv, &kvs_preset_lagkv);
    threads_same(&kvs_scorer_cur, &kvs_preset_cur);
    return kvs_test_finish("test_parts_rows");
}
