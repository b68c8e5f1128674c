/*
 * fuzz_safetensors.c -- fuzz target for the safetensors reader
 * (formats/safetensors.c) and the cache-dump validator on top of it
 * (formats/dump.c): the bytes are written to a file, opened with
 * kvs_st_open (every tensor looked up and its first and last byte read,
 * the metadata queried) and with kvs_dump_open. Errors are expected; a
 * crash or a sanitizer report is a bug. Not a test of what the values mean.
 */
#include "fuzz_util.h"
#include "kvs_formats.h"

static void touch(const void *p, size_t n) {
    if (!n) return;
    volatile uint8_t a = ((const uint8_t *)p)[0], b = ((const uint8_t *)p)[n - 1];
    (void)a;
    (void)b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], buf[32];
    fuzz_write("in.safetensors", data, size, path, sizeof path);
    kvs_err err = {0};
    kvs_st_file f;
    if (kvs_st_open(path, &f, &err) == KVS_OK) {
        kvs_st_meta(&f, "generator", buf, sizeof buf);
        for (int i = 0; i < f.n_tensors; i++) {
            const kvs_st_tensor *t = kvs_st_find(&f, f.tensors[i].name);
            if (t != &f.tensors[i]) abort(); /* names are unique */
            touch(t->data, t->nbytes);
        }
        kvs_st_close(&f);
    }
    kvs_dump d;
    if (kvs_dump_open(path, &d, &err) == KVS_OK) kvs_dump_close(&d);
    remove(path);
    return 0;
}
