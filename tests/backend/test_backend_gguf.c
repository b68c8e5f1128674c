/*
 * test_backend_gguf.c -- the GGUF reader and writer: metadata of every value
 * type (scalars written byte by byte here, arrays, strings), tensor infos and
 * data alignment, writer -> reader round trips for every supported tensor
 * type, and corrupt files: every truncation of a valid file, bad magic,
 * version, value types, tensor types, shapes, offsets, duplicate names.
 * Each error must be a clean kvs_status with a message naming the problem.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"

typedef struct {
    uint8_t b[4096];
    size_t n;
} raw;

static void put(raw *r, const void *p, size_t n) {
    memcpy(r->b + r->n, p, n);
    r->n += n;
}
static void u32(raw *r, uint32_t v) { put(r, &v, 4); }
static void u64(raw *r, uint64_t v) { put(r, &v, 8); }
static void str(raw *r, const char *s) {
    u64(r, strlen(s));
    put(r, s, strlen(s));
}

/* A hand-written file with one key of every scalar type and one tensor. */
static void hand_file(raw *r, uint32_t version) {
    r->n = 0;
    u32(r, 0x46554747u);
    u32(r, version);
    u64(r, 1);  /* tensors */
    u64(r, 12); /* kv */
    uint8_t u8v = 200;
    int8_t i8v = -5;
    uint16_t u16v = 60000;
    int16_t i16v = -30000;
    int32_t i32v = -7;
    float f32v = 1.5f;
    uint64_t u64v = 1ull << 40;
    int64_t i64v = -(1ll << 40);
    double f64v = 2.25;
    str(r, "k.u8"); u32(r, KVS_GGUF_U8); put(r, &u8v, 1);
    str(r, "k.i8"); u32(r, KVS_GGUF_I8); put(r, &i8v, 1);
    str(r, "k.u16"); u32(r, KVS_GGUF_U16); put(r, &u16v, 2);
    str(r, "k.i16"); u32(r, KVS_GGUF_I16); put(r, &i16v, 2);
    str(r, "k.u32"); u32(r, KVS_GGUF_U32); u32(r, 4000000000u);
    str(r, "k.i32"); u32(r, KVS_GGUF_I32); put(r, &i32v, 4);
    str(r, "k.f32"); u32(r, KVS_GGUF_F32); put(r, &f32v, 4);
    str(r, "k.bool"); u32(r, KVS_GGUF_BOOL); put(r, "\1", 1);
    str(r, "k.u64"); u32(r, KVS_GGUF_U64); put(r, &u64v, 8);
    str(r, "k.i64"); u32(r, KVS_GGUF_I64); put(r, &i64v, 8);
    str(r, "k.f64"); u32(r, KVS_GGUF_F64); put(r, &f64v, 8);
    str(r, "k.arr"); u32(r, KVS_GGUF_ARRAY); u32(r, KVS_GGUF_U16); u64(r, 3);
    uint16_t arr[3] = {1, 2, 3};
    put(r, arr, 6);
    str(r, "t0"); u32(r, 2); u64(r, 4); u64(r, 2); u32(r, KVS_GGML_F32); u64(r, 0);
    while (r->n % 32) r->b[r->n++] = 0;
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        put(r, &v, 4);
    }
}

static void metadata_types(void) {
    raw r;
    kvs_err err = {0};
    for (uint32_t ver = 2; ver <= 3; ver++) {
        hand_file(&r, ver);
        kvs_gguf g;
        kvs_err_clear(&err);
        kvs_status pst = kvs_gguf_parse(r.b, r.n, "hand.gguf", &g, &err);
        CHECK_MSG(pst == KVS_OK, "version %u: %s", ver, err.msg);
        if (pst) return;
        CHECK_EQ_INT(g.version, ver);
        int64_t i;
        double f;
        CHECK_OK(kvs_gguf_get_i64(&g, "k.u8", &i, &err), &err); CHECK_EQ_INT(i, 200);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.i8", &i, &err), &err); CHECK_EQ_INT(i, -5);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.u16", &i, &err), &err); CHECK_EQ_INT(i, 60000);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.i16", &i, &err), &err); CHECK_EQ_INT(i, -30000);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.u32", &i, &err), &err); CHECK_EQ_INT(i, 4000000000ll);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.i32", &i, &err), &err); CHECK_EQ_INT(i, -7);
        CHECK_OK(kvs_gguf_get_f64(&g, "k.f32", &f, &err), &err); CHECK_NEAR(f, 1.5, 0);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.bool", &i, &err), &err); CHECK_EQ_INT(i, 1);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.u64", &i, &err), &err); CHECK_EQ_INT(i, 1ll << 40);
        CHECK_OK(kvs_gguf_get_i64(&g, "k.i64", &i, &err), &err); CHECK_EQ_INT(i, -(1ll << 40));
        CHECK_OK(kvs_gguf_get_f64(&g, "k.f64", &f, &err), &err); CHECK_NEAR(f, 2.25, 0);
        CHECK_OK(kvs_gguf_get_f64(&g, "k.i32", &f, &err), &err); CHECK_NEAR(f, -7, 0);
        const kvs_gguf_kv *a = kvs_gguf_find_kv(&g, "k.arr");
        CHECK(a && a->type == KVS_GGUF_ARRAY && a->arr_type == KVS_GGUF_U16 && a->arr_n == 3);
        if (a) {
            uint16_t v;
            memcpy(&v, a->arr_data + 4, 2);
            CHECK_EQ_INT(v, 3);
        }
        CHECK_FAILS(kvs_gguf_get_i64(&g, "k.f32", &i, &err), KVS_ERR_FORMAT, &err, "k.f32");
        CHECK_FAILS(kvs_gguf_get_i64(&g, "nope", &i, &err), KVS_ERR_NOTFOUND, &err, "nope");
        char buf[8];
        CHECK_FAILS(kvs_gguf_get_str(&g, "k.u8", buf, sizeof buf, &err), KVS_ERR_FORMAT, &err, "string");
        const kvs_gguf_tensor *t = kvs_gguf_find_tensor(&g, "t0");
        CHECK(t && t->ne[0] == 4 && t->ne[1] == 2 && t->nbytes == 32);
        if (t) CHECK_NEAR(((const float *)t->data)[5], 5.0, 0);
        CHECK((const uint8_t *)t->data - r.b == (long)(r.n - 32));
        kvs_gguf_close(&g);
    }
    /* every truncation of the file fails cleanly */
    hand_file(&r, 3);
    int bad = 0;
    for (size_t n = 0; n < r.n; n++) {
        kvs_gguf g;
        kvs_err_clear(&err);
        kvs_status st = kvs_gguf_parse(r.b, n, "cut.gguf", &g, &err);
        if (st != KVS_ERR_FORMAT || !strstr(err.msg, "cut.gguf")) {
            if (!bad) fprintf(stderr, "truncation at %zu: status %d: %s\n", n, st, err.msg);
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void corrupt(void) {
    raw r;
    kvs_err err = {0};
    kvs_gguf g;
    hand_file(&r, 3);
    raw c = r;
    memcpy(c.b, "GGUX", 4);
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "not a GGUF file");
    c = r;
    c.b[4] = 1;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_UNSUPPORTED, &err, "version 1");
    c = r;
    c.b[8] = 0xff; /* absurd tensor count */
    c.b[15] = 0x7f;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "corrupt header");
    /* the value type of the first key: after header (24) + key length (8) + "k.u8" (4) */
    c = r;
    c.b[24 + 8 + 4] = 77;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "'k.u8' has invalid value type 77");
    /* tensor info: find "t0" */
    size_t ti = 0;
    for (size_t i = 0; i + 2 < r.n; i++)
        if (!memcmp(r.b + i, "t0", 2)) ti = i;
    CHECK(ti > 0);
    size_t type_off = ti + 2 + 4 + 16, off_off = type_off + 4;
    c = r;
    c.b[type_off] = 40;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_UNSUPPORTED, &err, "tensor 't0' has unknown type 40");
    c = r;
    c.b[off_off] = 4;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "not aligned");
    c = r;
    c.b[off_off + 1] = 1; /* offset 256: past the end */
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "'t0'");
    c = r;
    c.b[ti + 2] = 9; /* 9 dimensions */
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "dimensions");
    c = r;
    memset(c.b + ti + 2 + 4, 0, 8); /* ne[0] = 0 */
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "dimension 0");
    /* Q8_0 tensor whose row is not a whole number of blocks */
    c = r;
    c.b[type_off] = KVS_GGML_Q8_0;
    CHECK_FAILS(kvs_gguf_parse(c.b, c.n, "x.gguf", &g, &err), KVS_ERR_FORMAT, &err, "block size");
    /* file-level errors */
    CHECK_FAILS(kvs_gguf_open("/nonexistent/m.gguf", &g, &err), KVS_ERR_IO, &err, "/nonexistent/m.gguf");
    const char *tmp = "backend_gguf_short.gguf";
    FILE *f = fopen(tmp, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite("GGUF", 1, 4, f);
        fclose(f);
        CHECK_FAILS(kvs_gguf_open(tmp, &g, &err), KVS_ERR_FORMAT, &err, "too short");
        remove(tmp);
    }
}

static void writer_round_trip(void) {
    static const int types[] = {KVS_GGML_F32, KVS_GGML_F16, KVS_GGML_BF16, KVS_GGML_Q8_0,
                                KVS_GGML_Q5_0, KVS_GGML_Q4_K, KVS_GGML_Q6_K};
    kvs_err err = {0};
    kvs_gguf_writer *w = NULL;
    CHECK_OK(kvs_gguf_writer_new(&w, &err), &err);
    if (!w) return;
    const char *strs[3] = {"a", "", "\xe2\x96\x81x"};
    float fa[2] = {0.5f, -1};
    int32_t ia[3] = {1, -2, 3};
    CHECK_OK(kvs_gguf_writer_add_str(w, "general.architecture", "test", &err), &err);
    CHECK_OK(kvs_gguf_writer_add_arr_str(w, "s", strs, 3, &err), &err);
    CHECK_OK(kvs_gguf_writer_add_arr_f32(w, "f", fa, 2, &err), &err);
    CHECK_OK(kvs_gguf_writer_add_arr_i32(w, "i", ia, 3, &err), &err);
    CHECK_OK(kvs_gguf_writer_add_bool(w, "b", 1, &err), &err);
    uint64_t rng = 5;
    float src[7][512];
    uint8_t q[7][512 * 4];
    for (size_t t = 0; t < 7; t++) {
        for (int i = 0; i < 512; i++) src[t][i] = (float)kvs_rng_normal(&rng);
        CHECK_OK(kvs_quant_row(types[t], src[t], q[t], 512, &err), &err);
        char name[32];
        snprintf(name, sizeof name, "w.%s", kvs_ggml_type_name(types[t]));
        int64_t ne[2] = {256, 2};
        CHECK_OK(kvs_gguf_writer_add_tensor(w, name, types[t], 2, ne, q[t], &err), &err);
    }
    const char *path = "backend_gguf_rt.gguf";
    CHECK_OK(kvs_gguf_writer_write(w, path, &err), &err);
    kvs_gguf_writer_free(w);
    kvs_gguf g;
    kvs_err_clear(&err);
    kvs_status ost = kvs_gguf_open(path, &g, &err);
    CHECK_MSG(ost == KVS_OK, "%s", err.msg);
    if (ost) return;
    CHECK_EQ_INT(g.version, 3);
    const kvs_gguf_kv *s = kvs_gguf_find_kv(&g, "s");
    CHECK(s && s->arr_n == 3 && s->arr_strs[2].len == 4 && !memcmp(s->arr_strs[2].s, "\xe2\x96\x81x", 4) &&
          s->arr_strs[1].len == 0);
    const kvs_gguf_kv *fi = kvs_gguf_find_kv(&g, "i");
    CHECK(fi && fi->arr_type == KVS_GGUF_I32 && fi->arr_n == 3);
    char arch[16];
    CHECK_OK(kvs_gguf_get_str(&g, "general.architecture", arch, sizeof arch, &err), &err);
    CHECK(!strcmp(arch, "test"));
    CHECK_FAILS(kvs_gguf_get_str(&g, "general.architecture", arch, 3, &err), KVS_ERR_FORMAT, &err, "too long");
    for (size_t t = 0; t < 7; t++) {
        char name[32];
        snprintf(name, sizeof name, "w.%s", kvs_ggml_type_name(types[t]));
        const kvs_gguf_tensor *tt = kvs_gguf_find_tensor(&g, name);
        CHECK_MSG(tt != NULL, "tensor %s missing", name);
        if (!tt) continue;
        CHECK_EQ_INT(tt->type, types[t]);
        CHECK_EQ_INT(((uintptr_t)tt->data - (uintptr_t)g.map) % 32, 0);
        CHECK(tt->nbytes == kvs_ggml_row_size(types[t], 256) * 2 && !memcmp(tt->data, q[t], tt->nbytes));
    }
    kvs_gguf_close(&g);
    remove(path);
}

int main(void) {
    metadata_types();
    corrupt();
    writer_round_trip();
    return kvs_test_finish("backend_gguf");
}
