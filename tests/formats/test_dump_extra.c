/*
 * test_dump_extra.c -- the optional per-layer tensors of a cache dump:
 * layers.{l}.wo (W_o, [Hq, E, d]) and layers.{l}.recon (KVzip's statistic,
 * F32 [Hkv, N]). Round trips from kvs_synth_extra (F32 exact, BF16 equal to
 * the converted values, recon always exact), the view pointing at them; a
 * dump without them is the same file as before and opens with wo / recon
 * absent; every malformed case is an error naming the file, the tensor, the
 * layer and the bad index; the writer refuses bad extras; the synthetic
 * statistics are deterministic and have the planted structure.
 */
#include "kvs_formats.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static char dir[256];
static kvs_err *ep(kvs_err *e) { return e; }

static void free_list(float **a, int L) {
    if (!a) return;
    for (int l = 0; l < L; l++) free(a[l]);
    free(a);
}

static long file_bytes(const char *path, unsigned char **raw) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *raw = malloc((size_t)n + 1);
    if (fread(*raw, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

static void test_roundtrip(kvs_dtype dt) {
    kvs_synth_config cfg;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_preset("tiny", &cfg, &err), ep(&err));
    cfg.n_tokens = 50, cfg.n_queries = 50, cfg.n_probes = 3, cfg.seed = 9;
    CHECK_OK(kvs_synth_resolve(&cfg, &err), ep(&err));
    kvs_dense_cache c;
    int32_t *outl = NULL;
    CHECK_OK(kvs_synth_generate(&cfg, &c, NULL, &outl, &err), ep(&err));
    float **wo = NULL, **rc = NULL;
    const int E = 12, L = cfg.n_layers, Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads, d = cfg.head_dim, N = 50;
    CHECK_OK(kvs_synth_extra(&cfg, outl, cfg.n_outliers, E, &wo, &rc, &err), ep(&err));
    char path[300];
    snprintf(path, sizeof path, "%s/extra_%s.safetensors", dir, kvs_dtype_name(dt));
    kvs_dump_extra x = {(const float *const *)wo, Hq, E, (const float *const *)rc};
    CHECK_OK(kvs_dump_write_extra(path, &c, dt, NULL, 0, 0, outl, cfg.n_outliers, &x, NULL, &err), ep(&err));
    kvs_dump d0;
    CHECK_OK(kvs_dump_open(path, &d0, &err), ep(&err));
    int bad_wo = 0, bad_rc = 0;
    for (int l = 0; l < L && d0.view.layers; l++) {
        const kvs_layer *ly = &d0.view.layers[l];
        CHECK(ly->wo.data != NULL && ly->attn_recon_max != NULL);
        if (!ly->wo.data || !ly->attn_recon_max) continue;
        CHECK_EQ_INT(ly->wo.n_heads, Hq);
        CHECK_EQ_INT(ly->wo.n_tokens, E);
        CHECK_EQ_INT(ly->wo.head_dim, d);
        CHECK_EQ_INT(ly->wo.dtype, dt);
        float row[16];
        for (int h = 0; h < Hq; h++)
            for (int e = 0; e < E; e++) {
                kvs_view_rows_f32(&ly->wo, h, e, 1, row);
                const float *src = wo[l] + ((size_t)h * E + e) * d;
                for (int k = 0; k < d; k++) {
                    float want = dt == KVS_F32 ? src[k] : kvs_bf16_to_f32(kvs_f32_to_bf16(src[k]));
                    bad_wo += row[k] != want;
                }
            }
        for (int i = 0; i < Hkv * N; i++) bad_rc += ly->attn_recon_max[i] != rc[l][i];
    }
    CHECK_EQ_INT(bad_wo, 0);
    CHECK_EQ_INT(bad_rc, 0);
    const kvs_st_tensor *t = kvs_st_find(&d0.file, "layers.1.recon");
    CHECK(t && t->dtype == KVS_F32 && t->ndim == 2 && t->shape[0] == Hkv && t->shape[1] == N);
    t = kvs_st_find(&d0.file, "layers.0.wo");
    CHECK(t && t->dtype == dt && t->ndim == 3 && t->shape[0] == Hq && t->shape[1] == E && t->shape[2] == d);
    kvs_dump_close(&d0);

    /* Without extras: the same bytes as kvs_dump_write, and the view has none. */
    char p1[300], p2[300];
    snprintf(p1, sizeof p1, "%s/plain_a.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/plain_b.safetensors", dir);
    CHECK_OK(kvs_dump_write(p1, &c, dt, NULL, 0, 0, outl, cfg.n_outliers, NULL, &err), ep(&err));
    kvs_dump_extra none = {NULL, 0, 0, NULL};
    CHECK_OK(kvs_dump_write_extra(p2, &c, dt, NULL, 0, 0, outl, cfg.n_outliers, &none, NULL, &err), ep(&err));
    unsigned char *a = NULL, *b = NULL;
    long na = file_bytes(p1, &a), nb = file_bytes(p2, &b);
    CHECK(na > 0 && na == nb && memcmp(a, b, (size_t)na) == 0);
    free(a);
    free(b);
    CHECK_OK(kvs_dump_open(p1, &d0, &err), ep(&err));
    for (int l = 0; l < L && d0.view.layers; l++)
        CHECK(d0.view.layers[l].wo.data == NULL && d0.view.layers[l].attn_recon_max == NULL);
    kvs_dump_close(&d0);

    /* The writer's own checks. */
    rc[1][3 * 1 + N] = 1.5f; /* head 1, token 3 */
    CHECK_FAILS(kvs_dump_write_extra(path, &c, dt, NULL, 0, 0, NULL, 0, &x, NULL, &err), KVS_ERR_INVALID, &err,
                "layer 1: recon head 1 token 3 is 1.5, not a probability in [0, 1]");
    rc[1][3 * 1 + N] = 0.5f;
    float *keep = wo[1];
    wo[1] = NULL;
    CHECK_FAILS(kvs_dump_write_extra(path, &c, dt, NULL, 0, 0, NULL, 0, &x, NULL, &err), KVS_ERR_INVALID, &err,
                "layer 1: wo[1] is NULL");
    wo[1] = keep;
    x.wo_heads = 3;
    CHECK_FAILS(kvs_dump_write_extra(path, &c, dt, NULL, 0, 0, NULL, 0, &x, NULL, &err), KVS_ERR_INVALID, &err,
                "W_o Hq 3 is not a multiple of Hkv 2");
    free_list(wo, L);
    free_list(rc, L);
    free(outl);
    kvs_dense_cache_free(&c);
}

/* Deterministic in the seed; recon spread over (0, 1) and high on sinks and
 * outliers; W_o heads of different scales. */
static void test_synth_structure(void) {
    kvs_synth_config cfg;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_preset("tiny", &cfg, &err), ep(&err));
    cfg.n_tokens = 400, cfg.seed = 4, cfg.n_layers = 3;
    CHECK_OK(kvs_synth_resolve(&cfg, &err), ep(&err));
    const int L = 3, Hq = 4, Hkv = 2, d = 16, N = 400, E = 32, M = cfg.n_outliers, S = cfg.n_sinks;
    int32_t outl[8];
    for (int i = 0; i < M && i < 8; i++) outl[i] = 50 + 40 * i;
    float **w1 = NULL, **r1 = NULL, **w2 = NULL, **r2 = NULL;
    CHECK_OK(kvs_synth_extra(&cfg, outl, M, E, &w1, &r1, &err), ep(&err));
    CHECK_OK(kvs_synth_extra(&cfg, outl, M, E, &w2, NULL, &err), ep(&err));
    CHECK(w1 && r1 && w2);
    if (!w1 || !r1 || !w2) return;
    int same = 1;
    for (int l = 0; l < L; l++) same &= memcmp(w1[l], w2[l], sizeof(float) * (size_t)Hq * E * d) == 0;
    CHECK(same);
    cfg.seed = 5;
    CHECK_OK(kvs_synth_extra(&cfg, outl, M, E, NULL, &r2, &err), ep(&err));
    CHECK(r2 && memcmp(r1[0], r2[0], sizeof(float) * (size_t)Hkv * N) != 0);
    double lo = 1, hi = 0, sink = 1, out = 1, mean = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < Hkv; g++)
            for (int n = 0; n < N; n++) {
                double v = r1[l][(size_t)g * N + n];
                CHECK_MSG(v > 0 && v < 1, "recon %g", v);
                lo = v < lo ? v : lo, hi = v > hi ? v : hi;
                mean += v / (L * Hkv * N);
                if (n < S) sink = v < sink ? v : sink;
            }
    for (int i = 0; i < M; i++) {
        double m = 0;
        for (int l = 0; l < L; l++)
            for (int g = 0; g < Hkv; g++) m += r1[l][(size_t)g * N + outl[i]] / (L * Hkv);
        out = m < out ? m : out;
    }
    CHECK_MSG(lo < 0.05 && hi > 0.95, "recon spread [%g, %g]", lo, hi);
    CHECK_MSG(out > mean + 0.2, "outliers' mean recon %g vs overall %g", out, mean);
    CHECK_MSG(sink > mean, "sinks' least recon %g vs mean %g", sink, mean);
    double smin = 1e30, smax = 0;
    for (int h = 0; h < Hq; h++) {
        double s = 0;
        for (int i = 0; i < E * d; i++) s += fabs(w1[0][(size_t)h * E * d + i]);
        smin = s < smin ? s : smin, smax = s > smax ? s : smax;
    }
    CHECK_MSG(smax > 1.3 * smin, "W_o head scales %g .. %g", smin, smax);
    float **w3 = NULL;
    CHECK_FAILS(kvs_synth_extra(&cfg, outl, M, 0, &w3, NULL, &err), KVS_ERR_INVALID, &err, "E = 0 must be >= 1");
    CHECK(w3 == NULL);
    free_list(w1, L);
    free_list(w2, L);
    free_list(r1, L);
    free_list(r2, L);
}

/* ---- hand-made dumps: L = 3, Hkv = 2, N = 10, d = 8, Hq = 4, E = 6 --------- */

enum { XL = 3, XH = 2, XN = 10, XD = 8, XQ = 4, XE = 6 };

typedef struct {
    kvs_st_tensor t[XL * 5 + 1];
    char names[XL * 5 + 1][32];
    int n;
} xfile;

static float kv_data[XH * XN * XD], q_data[XQ * 2 * XD], wo_data[XQ * (XE + 1) * XD], rc_data[XH * XN];
static uint16_t rc16[XH * XN];

static kvs_st_tensor *add(xfile *f, const char *name, kvs_dtype dt, int ndim, int64_t a, int64_t b, int64_t c,
                          const void *data) {
    kvs_st_tensor *t = &f->t[f->n];
    snprintf(f->names[f->n], 32, "%s", name);
    t->name = f->names[f->n];
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = a, t->shape[1] = b, t->shape[2] = c;
    size_t cnt = (size_t)a * (size_t)b * (size_t)(ndim == 3 ? c : 1);
    t->nbytes = cnt * kvs_dtype_size(dt);
    t->data = data;
    f->n++;
    return t;
}

/* The good file: k, v, q, wo, recon in every layer. */
static void good(xfile *f) {
    memset(f, 0, sizeof *f);
    char nm[32];
    for (int l = 0; l < XL; l++) {
        snprintf(nm, sizeof nm, "layers.%d.k", l);
        add(f, nm, KVS_F32, 3, XH, XN, XD, kv_data);
        snprintf(nm, sizeof nm, "layers.%d.v", l);
        add(f, nm, KVS_F32, 3, XH, XN, XD, kv_data);
        snprintf(nm, sizeof nm, "layers.%d.q", l);
        add(f, nm, KVS_F32, 3, XQ, 2, XD, q_data);
        snprintf(nm, sizeof nm, "layers.%d.wo", l);
        add(f, nm, KVS_F32, 3, XQ, XE, XD, wo_data);
        snprintf(nm, sizeof nm, "layers.%d.recon", l);
        add(f, nm, KVS_F32, 2, XH, XN, 0, rc_data);
    }
}

static kvs_st_tensor *find(xfile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

static void drop(xfile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) {
            f->t[i] = f->t[f->n - 1];
            f->n--;
            return;
        }
}

static void expect(xfile *f, kvs_status code, const char *needle) {
    char path[300];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    kvs_err err;
    kvs_err_clear(&err);
    /* the table's names point into f->names, which drop() does not move */
    CHECK_OK(kvs_st_write(path, f->t, f->n, NULL, &err), ep(&err));
    kvs_dump d;
    if (code == KVS_OK) {
        CHECK_OK(kvs_dump_open(path, &d, &err), ep(&err));
        kvs_dump_close(&d);
        return;
    }
    CHECK_FAILS(kvs_dump_open(path, &d, &err), code, &err, needle);
    CHECK_MSG(strstr(err.msg, "x.safetensors") != NULL, "no file name in: %s", err.msg);
}

static void test_errors(void) {
    for (int i = 0; i < XH * XN * XD; i++) kv_data[i] = (float)((i * 7) % 13) * 0.1f;
    for (int i = 0; i < XQ * 2 * XD; i++) q_data[i] = (float)((i * 5) % 11) * 0.1f;
    for (int i = 0; i < XQ * (XE + 1) * XD; i++) wo_data[i] = (float)((i * 3) % 7) * 0.1f - 0.3f;
    for (int i = 0; i < XH * XN; i++) rc_data[i] = (float)i / (XH * XN);
    xfile f;
    good(&f);
    expect(&f, KVS_OK, NULL);
    /* present in some layers only */
    good(&f);
    drop(&f, "layers.1.wo");
    expect(&f, KVS_ERR_FORMAT, "missing layers.1.wo (layers.0.wo is present, so every layer needs one)");
    good(&f);
    drop(&f, "layers.0.recon");
    expect(&f, KVS_ERR_FORMAT, "layers.1.recon is present but layers.0.recon is not");
    good(&f);
    drop(&f, "layers.2.recon");
    expect(&f, KVS_ERR_FORMAT, "missing layers.2.recon");
    /* wo shapes */
    good(&f);
    find(&f, "layers.0.wo")->shape[2] = 7, find(&f, "layers.0.wo")->nbytes = XQ * XE * 7 * 4;
    expect(&f, KVS_ERR_FORMAT, "layers.0.wo has shape [4,6,7] but layers.0.k has [2,10,8]");
    good(&f);
    find(&f, "layers.1.wo")->shape[0] = 3, find(&f, "layers.1.wo")->nbytes = 3 * XE * XD * 4;
    expect(&f, KVS_ERR_FORMAT, "layers.1.wo has shape [3,6,8] but layers.1.k has [2,10,8]");
    good(&f);
    for (int l = 0; l < XL; l++) {
        char nm[32];
        snprintf(nm, sizeof nm, "layers.%d.wo", l);
        find(&f, nm)->shape[0] = 2, find(&f, nm)->nbytes = 2 * XE * XD * 4;
    }
    expect(&f, KVS_ERR_FORMAT, "layers.0.wo has shape [2,6,8] but layers.0.q has [4,2,8]");
    good(&f);
    find(&f, "layers.2.wo")->shape[1] = XE + 1, find(&f, "layers.2.wo")->nbytes = XQ * (XE + 1) * XD * 4;
    expect(&f, KVS_ERR_FORMAT, "layers.2.wo has shape [4,7,8] but layers.0.wo has [4,6,8]");
    good(&f);
    find(&f, "layers.0.wo")->ndim = 2, find(&f, "layers.0.wo")->shape[1] = XE * XD;
    expect(&f, KVS_ERR_FORMAT, "layers.0.wo has shape [4,48] (3 dims [Hq, E, d] expected)");
    good(&f);
    find(&f, "layers.1.wo")->dtype = KVS_U8, find(&f, "layers.1.wo")->nbytes = XQ * XE * XD;
    expect(&f, KVS_ERR_FORMAT, "layers.1.wo has dtype U8 (F32, F16 or BF16 expected)");
    /* without queries, Hq is any multiple of Hkv */
    good(&f);
    for (int l = 0; l < XL; l++) {
        char nm[32];
        snprintf(nm, sizeof nm, "layers.%d.q", l);
        drop(&f, nm);
        snprintf(nm, sizeof nm, "layers.%d.wo", l);
        find(&f, nm)->shape[0] = 2, find(&f, nm)->nbytes = 2 * XE * XD * 4;
    }
    expect(&f, KVS_OK, NULL);
    /* recon shapes, dtype and values */
    good(&f);
    find(&f, "layers.1.recon")->shape[1] = XN - 1, find(&f, "layers.1.recon")->nbytes = XH * (XN - 1) * 4;
    expect(&f, KVS_ERR_FORMAT, "layers.1.recon has shape [2,9] but layers.1.k has [2,10,8] (recon must be [Hkv, N])");
    good(&f);
    find(&f, "layers.0.recon")->ndim = 3, find(&f, "layers.0.recon")->shape[2] = 1;
    expect(&f, KVS_ERR_FORMAT, "layers.0.recon has shape [2,10,1] (2 dims [Hkv, N] expected)");
    good(&f);
    find(&f, "layers.0.recon")->dtype = KVS_F16, find(&f, "layers.0.recon")->nbytes = XH * XN * 2;
    find(&f, "layers.0.recon")->data = rc16;
    expect(&f, KVS_ERR_FORMAT, "layers.0.recon has dtype F16 (F32 expected)");
    static float rc_bad[XH * XN];
    const float bad_vals[3] = {1.5f, -0.25f, NAN};
    const char *want[3] = {"layers.2.recon head 1 token 7 is 1.5, not a probability in [0, 1]",
                           "layers.2.recon head 1 token 7 is -0.25, not a probability in [0, 1]",
                           "layers.2.recon head 1 token 7 is nan, not a probability in [0, 1]"};
    for (int k = 0; k < 3; k++) {
        good(&f);
        memcpy(rc_bad, rc_data, sizeof rc_bad);
        rc_bad[XN + 7] = bad_vals[k];
        find(&f, "layers.2.recon")->data = rc_bad;
        expect(&f, KVS_ERR_FORMAT, want[k]);
    }
    /* 0 and 1 are probabilities */
    good(&f);
    memcpy(rc_bad, rc_data, sizeof rc_bad);
    rc_bad[0] = 0.0f, rc_bad[XN] = 1.0f;
    find(&f, "layers.2.recon")->data = rc_bad;
    expect(&f, KVS_OK, NULL);
    /* a NaN in W_o */
    static float wo_bad[XQ * XE * XD];
    memcpy(wo_bad, wo_data, sizeof wo_bad);
    wo_bad[(2 * XE + 3) * XD + 5] = NAN; /* head 2, row 3, channel 5 */
    good(&f);
    find(&f, "layers.1.wo")->data = wo_bad;
    expect(&f, KVS_ERR_NUMERIC, "layers.1.wo head 2 token 3 channel 5");
    /* an unknown part still names the known ones */
    good(&f);
    add(&f, "layers.0.w_o", KVS_F32, 3, XQ, XE, XD, wo_data);
    expect(&f, KVS_ERR_FORMAT, "'layers.0.w_o' is not layers.{l}.k|v|q|probe|wo|recon");
}

int main(void) {
    const char *tmpd = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvs_dumpx_XXXXXX", tmpd && tmpd[0] ? tmpd : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_roundtrip(KVS_F32);
    test_roundtrip(KVS_BF16);
    test_synth_structure();
    test_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return kvs_test_finish("formats_dump_extra");
}
