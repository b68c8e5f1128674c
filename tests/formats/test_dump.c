/*
 * test_dump.c -- cache dumps: write/open round trips (F32 exact, F16/BF16
 * equal to the converted values) with queries, probes, modality and
 * outliers; every inconsistency in a dump is an error naming the file and
 * the tensor or layer (mismatched shapes, missing layers, bad modality or
 * outlier lists, NaN, unknown names, compressed caches).
 */
#include "kvs_formats.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static char dir[256];
static kvs_err *ep(kvs_err *e) { return e; }

static void test_roundtrip(kvs_dtype dt, double image_frac) {
    kvs_synth_config cfg;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_preset("tiny", &cfg, &err), ep(&err));
    cfg.n_tokens = 100;
    cfg.n_queries = 8;
    cfg.n_probes = 6;
    cfg.image_frac = image_frac;
    cfg.seed = 5;
    kvs_dense_cache c;
    float **probes = NULL;
    int32_t *outl = NULL;
    CHECK_OK(kvs_synth_generate(&cfg, &c, &probes, &outl, &err), ep(&err));
    int M = 4; /* auto: max(4, 100/256) */
    char path[300];
    snprintf(path, sizeof path, "%s/cache_%s.safetensors", dir, kvs_dtype_name(dt));
    const char *meta[] = {"generator", "kvsieve synth", "preset", "tiny", NULL};
    CHECK_OK(kvs_dump_write(path, &c, dt, (const float *const *)probes, cfg.n_probes, cfg.n_q_heads, outl, M,
                            meta, &err),
             ep(&err));
    kvs_dump d;
    CHECK_OK(kvs_dump_open(path, &d, &err), ep(&err));
    CHECK_EQ_INT(d.shape.n_layers, 2);
    CHECK_EQ_INT(d.shape.n_tokens, 100);
    CHECK_EQ_INT(d.shape.n_kv_heads, 2);
    CHECK_EQ_INT(d.shape.n_q_heads, 4);
    CHECK_EQ_INT(d.shape.head_dim, 16);
    CHECK_EQ_INT(d.shape.n_queries, 8);
    CHECK_EQ_INT(d.shape.threads, 1);
    CHECK_EQ_INT(d.n_outliers, M);
    for (int i = 0; i < M && d.outliers; i++) CHECK_EQ_INT(d.outliers[i], outl[i]);
    if (image_frac > 0) {
        CHECK(d.view.modality != NULL);
        int same = 1;
        for (int n = 0; n < 100 && d.view.modality; n++) same &= d.view.modality[n] == c.modality[n];
        CHECK(same);
    } else
        CHECK(d.view.modality == NULL);
    char buf[64];
    CHECK(kvs_st_meta(&d.file, "preset", buf, sizeof buf) && strcmp(buf, "tiny") == 0);
    float row[16];
    int bad = 0;
    for (int l = 0; l < 2; l++) {
        const kvs_layer *ly = &d.view.layers[l];
        CHECK_EQ_INT(ly->k.dtype, dt);
        for (int h = 0; h < 2; h++)
            for (int n = 0; n < 100; n++) {
                const float *srcs[2] = {c.layers[l].k, c.layers[l].v};
                const kvs_view *vs[2] = {&ly->k, &ly->v};
                for (int part = 0; part < 2; part++) {
                    kvs_view_rows_f32(vs[part], h, n, 1, row);
                    for (int ch = 0; ch < 16; ch++) {
                        float x = srcs[part][((size_t)h * 100 + n) * 16 + ch];
                        float want = dt == KVS_F32   ? x
                                     : dt == KVS_F16 ? kvs_f16_to_f32(kvs_f32_to_f16(x))
                                                     : kvs_bf16_to_f32(kvs_f32_to_bf16(x));
                        bad += row[ch] != want;
                    }
                }
            }
        for (int h = 0; h < 4; h++)
            for (int i = 0; i < 8; i++) {
                kvs_view_rows_f32(&ly->q, h, i, 1, row);
                float x = c.layers[l].q[((size_t)h * 8 + i) * 16 + 3];
                float want = dt == KVS_F32   ? x
                             : dt == KVS_F16 ? kvs_f16_to_f32(kvs_f32_to_f16(x))
                                             : kvs_bf16_to_f32(kvs_f32_to_bf16(x));
                bad += row[3] != want;
            }
        CHECK_EQ_INT(d.probes[l].dtype, KVS_F32); /* probes stay fp32 */
        CHECK_EQ_INT(d.probes[l].n_heads, 4);
        CHECK_EQ_INT(d.probes[l].n_tokens, 6);
        for (int h = 0; h < 4; h++)
            for (int p = 0; p < 6; p++) {
                kvs_view_rows_f32(&d.probes[l], h, p, 1, row);
                bad += memcmp(row, probes[l] + ((size_t)h * 6 + p) * 16, sizeof row) != 0;
            }
    }
    CHECK_EQ_INT(bad, 0);
    kvs_dump_close(&d);
    for (int l = 0; l < 2; l++) free(probes[l]);
    free(probes);
    free(outl);
    kvs_dense_cache_free(&c);
}

/* A dump file with L layers, k/v of shape [H, N, d] (override per layer). */
typedef struct {
    int L, H, N, d;
    int bad_layer, bad_part, bad_N; /* layers.{bad_layer}.{k|v} gets N = bad_N */
    int skip_layer, skip_part;      /* omit layers.{skip}.{k|v} */
    int q_only_layer;               /* add layers.{x}.q only there (-1 none) */
    int mod_len, mod_val;           /* modality length (0 none), a value to plant */
    int outl_unsorted;
    int nan_layer;                  /* NaN in layers.{x}.k (-1 none) */
    const char *extra;              /* an extra tensor name */
} spec;

static kvs_status write_spec(const char *path, const spec *s, kvs_err *err) {
    kvs_st_tensor t[64];
    char names[64][32];
    int n = 0;
    size_t maxe = (size_t)s->H * (size_t)(s->N > s->bad_N ? s->N : s->bad_N) * (size_t)s->d;
    float *zero = calloc(maxe, sizeof(float)), *nanbuf = calloc(maxe, sizeof(float));
    nanbuf[maxe / 2] = NAN;
    for (int l = 0; l < s->L; l++)
        for (int part = 0; part < 2; part++) {
            if (l == s->skip_layer && part == s->skip_part) continue;
            int N = (l == s->bad_layer && part == s->bad_part) ? s->bad_N : s->N;
            snprintf(names[n], 32, "layers.%d.%s", l, part ? "v" : "k");
            t[n] = (kvs_st_tensor){.name = names[n], .dtype = KVS_F32, .ndim = 3, .shape = {s->H, N, s->d},
                                   .data = (l == s->nan_layer && part == 0) ? nanbuf : zero,
                                   .nbytes = (size_t)s->H * N * s->d * 4};
            n++;
        }
    if (s->q_only_layer >= 0) {
        snprintf(names[n], 32, "layers.%d.q", s->q_only_layer);
        t[n] = (kvs_st_tensor){.name = names[n], .dtype = KVS_F32, .ndim = 3, .shape = {s->H, 1, s->d},
                               .data = zero, .nbytes = (size_t)s->H * s->d * 4};
        n++;
    }
    uint8_t mod[512] = {0};
    if (s->mod_len) {
        mod[s->mod_len / 2] = (uint8_t)s->mod_val;
        t[n++] = (kvs_st_tensor){.name = "modality", .dtype = KVS_U8, .ndim = 1, .shape = {s->mod_len},
                                 .data = mod, .nbytes = (size_t)s->mod_len};
    }
    int32_t ol[3] = {1, 5, 9};
    if (s->outl_unsorted) {
        ol[1] = 0;
        t[n++] = (kvs_st_tensor){.name = "outliers", .dtype = KVS_I32, .ndim = 1, .shape = {3}, .data = ol,
                                 .nbytes = 12};
    }
    if (s->extra)
        t[n++] = (kvs_st_tensor){.name = (char *)s->extra, .dtype = KVS_F32, .ndim = 1, .shape = {1},
                                 .data = zero, .nbytes = 4};
    kvs_status st = kvs_st_write(path, t, n, NULL, err);
    free(zero);
    free(nanbuf);
    return st;
}

static spec base_spec(void) {
    spec s = {.L = 5, .H = 2, .N = 128, .d = 8, .bad_layer = -1, .skip_layer = -1, .q_only_layer = -1,
              .nan_layer = -1};
    return s;
}

static void test_errors(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/cache.safetensors", dir);
    kvs_err err;
    kvs_dump d;
    spec s = base_spec();
    kvs_err_clear(&err);
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_OK(kvs_dump_open(path, &d, &err), ep(&err));
    CHECK_EQ_INT(d.shape.n_layers, 5);
    CHECK_EQ_INT(d.shape.n_queries, 0);
    CHECK(d.view.layers[0].q.data == NULL);
    CHECK(d.probes[0].data == NULL && d.outliers == NULL && d.n_outliers == 0);
    kvs_dump_close(&d);

    s = base_spec();
    s.bad_layer = 3, s.bad_part = 1, s.bad_N = 100;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err,
                "cache.safetensors: layers.3.v has shape [2,100,8] but layers.3.k has [2,128,8]");
    s = base_spec();
    s.bad_layer = 2, s.bad_part = 0, s.bad_N = 100;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "layers.2.v has shape [2,128,8] but layers.2.k has [2,100,8]");
    s = base_spec();
    s.skip_layer = 2, s.skip_part = 0;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err,
                "missing layers.2.k (layers 0..4 expected from layers.0..4 present)");
    s = base_spec();
    s.q_only_layer = 1;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "layers.1.q is present but layers.0.q is not");
    s = base_spec();
    s.q_only_layer = 0;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "missing layers.1.q");
    s = base_spec();
    s.mod_len = 100;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "modality is U8 [100] but must be U8 [128]");
    s.mod_len = 128, s.mod_val = 9;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "modality[64] = 9");
    s = base_spec();
    s.outl_unsorted = 1;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "outliers[1] = 0");
    s = base_spec();
    s.nan_layer = 4;
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_NUMERIC, &err, "cache.safetensors");
    CHECK(strstr(err.msg, "layer 4") != NULL);
    s = base_spec();
    s.extra = "layers.1.x";
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "'layers.1.x' is not layers.{l}.k|v|q|probe|wo|recon");
    s.extra = "weights";
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "unexpected tensor 'weights'");
    s.extra = "modality"; /* F32 modality */
    CHECK_OK(write_spec(path, &s, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "modality is F32 [1]");
    /* only non-layer tensors */
    float one = 1;
    kvs_st_tensor t = {.name = "outliers", .dtype = KVS_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4};
    CHECK_OK(kvs_st_write(path, &t, 1, NULL, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "not a cache dump");
    /* 2-D key tensor */
    t = (kvs_st_tensor){.name = "layers.0.k", .dtype = KVS_F32, .ndim = 2, .shape = {1, 1}, .data = &one, .nbytes = 4};
    kvs_st_tensor t2 = t;
    t2.name = "layers.0.v";
    kvs_st_tensor tt[2] = {t, t2};
    CHECK_OK(kvs_st_write(path, tt, 2, NULL, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "layers.0.k has shape [1,1] (3 dims");
    /* U8 keys */
    tt[0].dtype = tt[1].dtype = KVS_U8;
    tt[0].ndim = tt[1].ndim = 3;
    tt[0].shape[2] = tt[1].shape[2] = 4;
    CHECK_OK(kvs_st_write(path, tt, 2, NULL, &err), ep(&err));
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "layers.0.k has dtype U8");
    /* a missing file */
    snprintf(path, sizeof path, "%s/nope.safetensors", dir);
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_IO, &err, "nope.safetensors");
}

/* A compressed cache (layers of different lengths) writes, but does not
 * open as a dump (its layers disagree). */
static void test_compressed(void) {
    float k0[2 * 3 * 4], k1[2 * 5 * 4];
    for (int i = 0; i < 24; i++) k0[i] = (float)i;
    for (int i = 0; i < 40; i++) k1[i] = (float)-i;
    kvs_dense_layer ly[2] = {{.n_tokens = 3, .n_kv_heads = 2, .head_dim = 4, .k = k0, .v = k0},
                             {.n_tokens = 5, .n_kv_heads = 2, .head_dim = 4, .k = k1, .v = k1}};
    kvs_dense_cache c = {.n_layers = 2, .layers = ly, .n_tokens = 10, .modality = NULL};
    char path[300];
    snprintf(path, sizeof path, "%s/comp.safetensors", dir);
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_dump_write(path, &c, KVS_BF16, NULL, 0, 0, NULL, 0, NULL, &err), ep(&err));
    kvs_st_file f;
    CHECK_OK(kvs_st_open(path, &f, &err), ep(&err));
    const kvs_st_tensor *t = kvs_st_find(&f, "layers.1.k");
    CHECK(t && t->shape[1] == 5 && t->dtype == KVS_BF16);
    if (t) CHECK(kvs_bf16_to_f32(((const uint16_t *)t->data)[7]) == -7.0f);
    kvs_st_close(&f);
    kvs_dump d;
    CHECK_FAILS(kvs_dump_open(path, &d, &err), KVS_ERR_FORMAT, &err, "layers.1.k has shape [2,5,4] but layers.0.k has [2,3,4]");
    CHECK_FAILS(kvs_dump_write(path, &c, KVS_U8, NULL, 0, 0, NULL, 0, NULL, &err), KVS_ERR_INVALID, &err,
                "comp.safetensors: dump dtype");
    ly[1].k = NULL;
    CHECK_FAILS(kvs_dump_write(path, &c, KVS_F32, NULL, 0, 0, NULL, 0, NULL, &err), KVS_ERR_INVALID, &err,
                "layer 1 is empty");
}

/* The F16 dump from the round trip, cut at many lengths: always a clean
 * format error, nothing leaked (ASan). */
static void test_truncated(void) {
    char path[300], cut[300];
    snprintf(path, sizeof path, "%s/cache_F16.safetensors", dir);
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *raw = malloc((size_t)n);
    CHECK((long)fread(raw, 1, (size_t)n, f) == n);
    fclose(f);
    int bad = 0;
    for (long len = 0; len < n; len += 1 + len / 3) {
        FILE *g = fopen(cut, "wb");
        fwrite(raw, 1, (size_t)len, g);
        fclose(g);
        kvs_dump d;
        kvs_err err;
        kvs_err_clear(&err);
        kvs_status st = kvs_dump_open(cut, &d, &err);
        if (st != KVS_ERR_FORMAT || !strstr(err.msg, "cut.safetensors")) {
            fprintf(stderr, "dump cut at %ld of %ld: %d: %s\n", len, n, (int)st, err.msg);
            bad++;
        }
        if (st == KVS_OK) kvs_dump_close(&d);
    }
    CHECK_EQ_INT(bad, 0);
    free(raw);
}

int main(void) {
    const char *tmpd = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvs_dump_XXXXXX", tmpd && tmpd[0] ? tmpd : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_roundtrip(KVS_F32, 0.3);
    test_roundtrip(KVS_F16, 0.0);
    test_roundtrip(KVS_BF16, 0.5);
    test_errors();
    test_compressed();
    test_truncated();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return kvs_test_finish("formats_dump");
}
