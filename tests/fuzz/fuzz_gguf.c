/*
 * fuzz_gguf.c -- libFuzzer target for the GGUF reader: parse arbitrary bytes;
 * when they parse, read every metadata value back through the typed getters
 * and dequantise the first row of every tensor of a supported type. Any
 * crash, sanitizer report or hang is a bug; errors are expected.
 *
 * Build and run: tests/fuzz/README.md.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvs_gguf g;
    kvs_err err = {0};
    if (kvs_gguf_parse(data, size, "fuzz", &g, &err) != KVS_OK) return 0;
    for (uint64_t i = 0; i < g.n_kv; i++) {
        char key[256], buf[64];
        const kvs_gguf_kv *kv = &g.kv[i];
        size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.s, n);
        key[n] = 0;
        int64_t iv;
        double dv;
        kvs_gguf_get_i64(&g, key, &iv, NULL);
        kvs_gguf_get_f64(&g, key, &dv, NULL);
        kvs_gguf_get_str(&g, key, buf, sizeof buf, NULL);
        if (kv->type == KVS_GGUF_ARRAY && kv->arr_type == KVS_GGUF_STRING)
            for (uint64_t j = 0; j < kv->arr_n && j < 64; j++) {
                volatile char c = kv->arr_strs[j].len ? kv->arr_strs[j].s[kv->arr_strs[j].len - 1] : 0;
                (void)c;
            }
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const kvs_gguf_tensor *t = &g.tensors[i];
        if (!kvs_ggml_type_supported(t->type) || t->ne[0] > 4096) continue;
        float *row = malloc((size_t)t->ne[0] * sizeof *row);
        if (row) {
            kvs_dequant_row(t->type, t->data, row, t->ne[0], NULL);
            free(row);
        }
    }
    kvs_gguf_close(&g);
    return 0;
}
