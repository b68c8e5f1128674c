/*
 * test_st.c -- safetensors reader and writer: round trips for every dtype
 * over random shapes, a hand-written golden file parsed exactly (aligned
 * and misaligned data), every malformed case giving KVS_ERR_FORMAT with the
 * right words, truncation at every length and random header corruption
 * (never a crash, always a clean error), writer errors.
 */
#include "kvs_formats.h"
#include "test_util.h"

#include <stdint.h>
#include <unistd.h>

static char dir[256];

/* CHECK_OK tests its error pointer for NULL; pass it through a call. */
static kvs_err *ep(kvs_err *e) { return e; }

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* Write 8-byte length + header text (+ pad spaces) + data. */
static void write_raw(const char *path, const char *hdr, size_t pad, const void *data, size_t dlen) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    uint64_t hl = strlen(hdr) + pad;
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    if (dlen) fwrite(data, 1, dlen, f);
    fclose(f);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

/* ---- golden ----------------------------------------------------------------- */

static void test_golden(int aligned) {
    /* a: F32 [2] = {1.5, -2}; b: U8 [3] = {1,2,3}; c: I32 [1,1] = {-7};
     * h: F16 [1] = 0x3c00 (1.0); z: BF16 [0] (empty). Data order a, c, h, b. */
    const char *hdr =
        "{\"__metadata__\":{\"generator\":\"hand\",\"seed\":\"42\"},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[14,17]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"c\":{\"dtype\":\"I32\",\"shape\":[1,1],\"data_offsets\":[8,12]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[12,14]},"
        "\"z\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[17,17]}}";
    unsigned char data[17] = {0x00, 0x00, 0xc0, 0x3f, /* 1.5f */
                              0x00, 0x00, 0x00, 0xc0, /* -2.0f */
                              0xf9, 0xff, 0xff, 0xff, /* -7 */
                              0x00, 0x3c,             /* f16 1.0 */
                              1,    2,    3};
    char path[300];
    path_in(path, sizeof path, "golden.safetensors");
    size_t pad = (8 - (8 + strlen(hdr)) % 8) % 8;
    if (!aligned) pad = (pad + 1) % 8; /* data start off an 8-byte boundary */
    write_raw(path, hdr, pad, data, sizeof data);
    kvs_st_file f;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_st_open(path, &f, &err), ep(&err));
    CHECK_EQ_INT(f.n_tensors, 5);
    const kvs_st_tensor *a = kvs_st_find(&f, "a"), *b = kvs_st_find(&f, "b"), *c = kvs_st_find(&f, "c");
    const kvs_st_tensor *h = kvs_st_find(&f, "h"), *z = kvs_st_find(&f, "z");
    CHECK(a && b && c && h && z);
    CHECK(kvs_st_find(&f, "nope") == NULL);
    if (a && b && c && h && z) {
        CHECK_EQ_INT(a->dtype, KVS_F32);
        CHECK_EQ_INT(a->ndim, 1);
        CHECK_EQ_INT(a->shape[0], 2);
        CHECK_EQ_INT(a->nbytes, 8);
        CHECK_EQ_INT(((uintptr_t)a->data) % 4, 0);
        CHECK_EQ_INT(((uintptr_t)c->data) % 4, 0);
        if (aligned) CHECK((const char *)a->data == (const char *)f.map + 8 + strlen(hdr) + pad);
        CHECK(((const float *)a->data)[0] == 1.5f);
        CHECK(((const float *)a->data)[1] == -2.0f);
        CHECK_EQ_INT(b->dtype, KVS_U8);
        CHECK_EQ_INT(((const uint8_t *)b->data)[2], 3);
        CHECK_EQ_INT(c->dtype, KVS_I32);
        CHECK_EQ_INT(c->ndim, 2);
        CHECK_EQ_INT(((const int32_t *)c->data)[0], -7);
        CHECK_EQ_INT(h->dtype, KVS_F16);
        CHECK(kvs_f16_to_f32(((const uint16_t *)h->data)[0]) == 1.0f);
        CHECK_EQ_INT(z->dtype, KVS_BF16);
        CHECK_EQ_INT(z->nbytes, 0);
    }
    char buf[64];
    CHECK(kvs_st_meta(&f, "seed", buf, sizeof buf) && strcmp(buf, "42") == 0);
    CHECK(kvs_st_meta(&f, "generator", buf, sizeof buf) && strcmp(buf, "hand") == 0);
    CHECK(kvs_st_meta(&f, "missing", buf, sizeof buf) == NULL);
    CHECK(f.metadata_json && strstr(f.metadata_json, "generator"));
    kvs_st_close(&f);
}

/* ---- round trips ------------------------------------------------------------ */

static void test_roundtrip(void) {
    uint64_t rs = 12345;
    char path[300];
    path_in(path, sizeof path, "rt.safetensors");
    for (int rep = 0; rep < 20; rep++) {
        enum { NT = 5 };
        kvs_st_tensor t[NT];
        void *bufs[NT];
        char names[NT][32];
        for (int i = 0; i < NT; i++) {
            kvs_dtype dt = (kvs_dtype)((rep + i) % 5);
            t[i].dtype = dt;
            t[i].ndim = (int)(kvs_rng_next(&rs) % 4);
            size_t cnt = 1;
            for (int k = 0; k < t[i].ndim; k++) {
                t[i].shape[k] = (int64_t)(kvs_rng_next(&rs) % 7); /* zero dims too */
                cnt *= (size_t)t[i].shape[k];
            }
            t[i].nbytes = cnt * kvs_dtype_size(dt);
            bufs[i] = malloc(t[i].nbytes + 1);
            for (size_t k = 0; k < t[i].nbytes; k++) ((unsigned char *)bufs[i])[k] = (unsigned char)kvs_rng_next(&rs);
            t[i].data = bufs[i];
            snprintf(names[i], sizeof names[i], "t%d.%s", (int)(kvs_rng_next(&rs) % 1000) * NT + i,
                     kvs_dtype_name(dt));
            t[i].name = names[i];
        }
        const char *meta[] = {"who", "test \"quoted\"", "rep", "x", NULL};
        kvs_err err;
        kvs_err_clear(&err);
        CHECK_OK(kvs_st_write(path, t, NT, rep % 2 ? meta : NULL, &err), ep(&err));
        char tmp[320];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        CHECK(access(tmp, F_OK) != 0);
        size_t fsz;
        unsigned char *raw = read_all(path, &fsz);
        CHECK(raw != NULL);
        if (raw) {
            uint64_t hl = 0;
            for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
            CHECK_EQ_INT((8 + hl) % 8, 0);
            free(raw);
        }
        kvs_st_file f;
        CHECK_OK(kvs_st_open(path, &f, &err), ep(&err));
        CHECK_EQ_INT(f.n_tensors, NT);
        for (int i = 0; i < NT; i++) {
            const kvs_st_tensor *r = kvs_st_find(&f, names[i]);
            CHECK(r != NULL);
            if (!r) continue;
            CHECK_EQ_INT(r->dtype, t[i].dtype);
            CHECK_EQ_INT(r->ndim, t[i].ndim);
            for (int k = 0; k < t[i].ndim; k++) CHECK_EQ_INT(r->shape[k], t[i].shape[k]);
            CHECK_EQ_INT(r->nbytes, t[i].nbytes);
            CHECK(t[i].nbytes == 0 || memcmp(r->data, bufs[i], t[i].nbytes) == 0);
            CHECK_EQ_INT(((uintptr_t)r->data) % kvs_dtype_size(r->dtype), 0);
        }
        char buf[64];
        if (rep % 2)
            CHECK(kvs_st_meta(&f, "who", buf, sizeof buf) && strcmp(buf, "test \"quoted\"") == 0);
        else
            CHECK(f.metadata_json == NULL);
        kvs_st_close(&f);
        for (int i = 0; i < NT; i++) free(bufs[i]);
    }
}

/* ---- malformed -------------------------------------------------------------- */

#define OK_T "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void expect_bad(const char *hdr, size_t dlen, kvs_status code, const char *needle, int line) {
    char path[300];
    path_in(path, sizeof path, "bad.safetensors");
    unsigned char data[64] = {0};
    write_raw(path, hdr, 0, data, dlen);
    kvs_st_file f;
    kvs_err err;
    kvs_err_clear(&err);
    kvs_status st = kvs_st_open(path, &f, &err);
    kvs_test_checks++;
    if (st != code || !strstr(err.msg, needle) || !strstr(err.msg, "bad.safetensors")) {
        fprintf(stderr, "line %d: header %s: expected %d with \"%s\"; got %d: %s\n", line, hdr, (int)code,
                needle, (int)st, err.msg);
        kvs_test_failures++;
    }
    if (st == KVS_OK) kvs_st_close(&f);
}

static void test_malformed(void) {
    char path[300];
    path_in(path, sizeof path, "short.safetensors");
    kvs_st_file f;
    kvs_err err;
    write_bytes(path, (const unsigned char *)"\x10\0\0", 3);
    CHECK_FAILS(kvs_st_open(path, &f, &err), KVS_ERR_FORMAT, &err, "shorter than");
    CHECK(strstr(err.msg, "short.safetensors"));
    /* header length past end of file */
    unsigned char b[20] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(path, b, 10);
    CHECK_FAILS(kvs_st_open(path, &f, &err), KVS_ERR_FORMAT, &err, "past end of file");
    /* absurd header length */
    unsigned char c[16] = {0, 0, 0, 0, 0, 1, 0, 0};
    write_bytes(path, c, 16);
    CHECK_FAILS(kvs_st_open(path, &f, &err), KVS_ERR_FORMAT, &err, "absurd");
    /* missing file */
    path_in(path, sizeof path, "does-not-exist.safetensors");
    CHECK_FAILS(kvs_st_open(path, &f, &err), KVS_ERR_IO, &err, "does-not-exist.safetensors");

    expect_bad("{\"t\": [1, 2", 0, KVS_ERR_FORMAT, "not valid JSON", __LINE__);
    expect_bad("not json", 0, KVS_ERR_FORMAT, "not valid JSON", __LINE__);
    expect_bad("[1,2,3]", 0, KVS_ERR_FORMAT, "not an object", __LINE__);
    expect_bad("{} x", 0, KVS_ERR_FORMAT, "after the JSON", __LINE__);
    expect_bad("{\"t\":5}", 0, KVS_ERR_FORMAT, "'t' is not an object", __LINE__);
    expect_bad("{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT, "missing field 'dtype'",
               __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "missing field 'shape'", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, KVS_ERR_FORMAT, "missing field 'data_offsets'",
               __LINE__);
    expect_bad("{\"t\":{\"dtype\":3,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "dtype is not a string", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, KVS_ERR_FORMAT,
               "out of range", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, KVS_ERR_FORMAT,
               "begin 8 > end 0", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "needs 12", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "negative", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "shape[0]", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, KVS_ERR_FORMAT,
               "data_offsets", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8, KVS_ERR_FORMAT,
               "non-negative", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
               KVS_ERR_FORMAT, "9 dims", __LINE__);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
               8, KVS_ERR_FORMAT, "more than", __LINE__);
    expect_bad("{" OK_T ",\"u\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               KVS_ERR_FORMAT, "overlap", __LINE__);
    expect_bad("{" OK_T ",\"u\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16,
               KVS_ERR_FORMAT, "gap", __LINE__);
    expect_bad("{" OK_T "}", 12, KVS_ERR_FORMAT, "4 trailing bytes", __LINE__);
    expect_bad("{" OK_T "," OK_T "}", 8, KVS_ERR_FORMAT, "appears twice", __LINE__);
    expect_bad("{" OK_T ",\"__metadata__\":{\"a\":1}}", 8, KVS_ERR_FORMAT, "value 'a' is not a string",
               __LINE__);
    expect_bad("{" OK_T ",\"__metadata__\":[]}", 8, KVS_ERR_FORMAT, "__metadata__ is not an object", __LINE__);
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KVS_ERR_FORMAT,
               "empty name", __LINE__);
    expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, KVS_ERR_UNSUPPORTED,
               "'w': dtype F64", __LINE__);
    expect_bad("{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, KVS_ERR_UNSUPPORTED,
               "'w': unknown dtype 'Q4'", __LINE__);
    /* F32 at an odd offset cannot be aligned */
    expect_bad("{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}",
               5, KVS_ERR_UNSUPPORTED, "not a multiple", __LINE__);
    /* empty header */
    path_in(path, sizeof path, "bad.safetensors");
    unsigned char e[8] = {0};
    write_bytes(path, e, 8);
    CHECK_FAILS(kvs_st_open(path, &f, &err), KVS_ERR_FORMAT, &err, "empty");
}

/* Truncate a valid file at every length and corrupt header bytes at random:
 * every outcome is a clean status, never a crash (run under ASan too). */
static void test_truncation_and_fuzz(void) {
    char path[300], cut[300];
    path_in(path, sizeof path, "full.safetensors");
    path_in(cut, sizeof cut, "cut.safetensors");
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {1, 2, 3};
    uint8_t u[5] = {9, 8, 7, 6, 5};
    kvs_st_tensor t[3] = {
        {.name = "layers.0.k", .dtype = KVS_F32, .ndim = 3, .shape = {1, 2, 3}, .data = a, .nbytes = 24},
        {.name = "h", .dtype = KVS_BF16, .ndim = 1, .shape = {3}, .data = h, .nbytes = 6},
        {.name = "modality", .dtype = KVS_U8, .ndim = 1, .shape = {5}, .data = u, .nbytes = 5},
    };
    const char *meta[] = {"k", "v", NULL};
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_st_write(path, t, 3, meta, &err), ep(&err));
    size_t n;
    unsigned char *raw = read_all(path, &n);
    CHECK(raw != NULL);
    if (!raw) return;
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        write_bytes(cut, raw, len);
        kvs_st_file f;
        kvs_err_clear(&err);
        kvs_status st = kvs_st_open(cut, &f, &err);
        if (st != KVS_ERR_FORMAT || !strstr(err.msg, "cut.safetensors")) {
            fprintf(stderr, "truncated at %zu of %zu: got %d: %s\n", len, n, (int)st, err.msg);
            bad++;
        }
        if (st == KVS_OK) kvs_st_close(&f);
    }
    CHECK_EQ_INT(bad, 0);
    /* random corruption of the header bytes */
    uint64_t rs = 777;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    unsigned char *mod = malloc(n);
    int unclean = 0;
    for (int rep = 0; rep < 400; rep++) {
        memcpy(mod, raw, n);
        int flips = 1 + (int)(kvs_rng_next(&rs) % 3);
        for (int k = 0; k < flips; k++) {
            size_t pos = (size_t)(kvs_rng_next(&rs) % (8 + hl));
            mod[pos] = (unsigned char)kvs_rng_next(&rs);
        }
        write_bytes(cut, mod, n);
        kvs_st_file f;
        kvs_err_clear(&err);
        kvs_status st = kvs_st_open(cut, &f, &err);
        if (st == KVS_OK) {
            /* whatever parsed must lie inside the mapping */
            for (int i = 0; i < f.n_tensors; i++)
                if ((const char *)f.tensors[i].data + f.tensors[i].nbytes > (const char *)f.map + f.map_size)
                    unclean++;
            kvs_st_close(&f);
        } else if (st != KVS_ERR_FORMAT && st != KVS_ERR_UNSUPPORTED) {
            fprintf(stderr, "fuzz rep %d: status %d: %s\n", rep, (int)st, err.msg);
            unclean++;
        } else if (!err.msg[0])
            unclean++;
    }
    CHECK_EQ_INT(unclean, 0);
    free(mod);
    free(raw);
}

static void test_writer_errors(void) {
    char path[300];
    path_in(path, sizeof path, "w.safetensors");
    float a[2] = {1, 2};
    kvs_st_tensor t = {.name = "a", .dtype = KVS_F32, .ndim = 1, .shape = {3}, .data = a, .nbytes = 8};
    kvs_err err;
    CHECK_FAILS(kvs_st_write(path, &t, 1, NULL, &err), KVS_ERR_INVALID, &err, "w.safetensors: tensor 'a': nbytes");
    t.shape[0] = 2;
    kvs_st_tensor two[2] = {t, t};
    CHECK_FAILS(kvs_st_write(path, two, 2, NULL, &err), KVS_ERR_INVALID, &err, "given twice");
    t.shape[0] = -2;
    CHECK_FAILS(kvs_st_write(path, &t, 1, NULL, &err), KVS_ERR_INVALID, &err, "negative");
    t.shape[0] = 2;
    t.name = "__metadata__";
    CHECK_FAILS(kvs_st_write(path, &t, 1, NULL, &err), KVS_ERR_INVALID, &err, "invalid name");
    t.name = "a";
    const char *dup[] = {"a", "1", "a", "2", NULL};
    CHECK_FAILS(kvs_st_write(path, &t, 1, dup, &err), KVS_ERR_INVALID, &err, "metadata key 'a' given twice");
    const char *meta[] = {"odd", NULL};
    CHECK_FAILS(kvs_st_write(path, &t, 1, meta, &err), KVS_ERR_INVALID, &err, "'odd' has no value");
    char nodir[320];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", dir);
    CHECK_FAILS(kvs_st_write(nodir, &t, 1, NULL, &err), KVS_ERR_IO, &err, "no/such/dir/x.safetensors");
    /* zero tensors: a valid, empty file */
    kvs_err_clear(&err);
    CHECK_OK(kvs_st_write(path, NULL, 0, NULL, &err), ep(&err));
    kvs_st_file f;
    CHECK_OK(kvs_st_open(path, &f, &err), ep(&err));
    CHECK_EQ_INT(f.n_tensors, 0);
    kvs_st_close(&f);
}

int main(void) {
    const char *tmpd = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvs_st_XXXXXX", tmpd && tmpd[0] ? tmpd : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_golden(0); /* data misaligned -> shifted copy */
    test_golden(1); /* data at an 8-byte boundary -> mapped as is */
    test_roundtrip();
    test_malformed();
    test_truncation_and_fuzz();
    test_writer_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return kvs_test_finish("formats_st");
}
