/*
 * kvquant_tool.c -- the engine's Q8_0 / Q4_0 KV cache rows for a test in
 * another language (python/tests/test_hf_quant.py, kvsieve-hf's torch copy):
 * reads ROWS x N fp32 values, writes each row as the cache stores it
 * (kvs_cache_from_f32: the block bytes) and as a read gives it back
 * (kvs_cache_to_f32: fp32).
 *
 *   kvquant_tool q8_0|q4_0 ROWS N IN.f32 OUT.blocks OUT.f32
 *
 * What it is not: a test by itself (it checks nothing but its arguments).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvs_cpu.h"

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: kvquant_tool q8_0|q4_0 ROWS N IN.f32 OUT.blocks OUT.f32\n");
        return 2;
    }
    int ct = -1;
    kvs_err err = {0};
    if (kvs_cache_type_parse(argv[1], &ct, &err) != KVS_OK || !kvs_cache_is_block(ct)) {
        fprintf(stderr, "kvquant_tool: %s: not a block cache type (q8_0, q4_0)\n", argv[1]);
        return 2;
    }
    const int rows = atoi(argv[2]), n = atoi(argv[3]);
    if (rows < 1 || n < 32 || n % 32) {
        fprintf(stderr, "kvquant_tool: ROWS >= 1 and N a positive multiple of 32\n");
        return 2;
    }
    const size_t rb = kvs_cache_row_size(ct, n);
    float *x = malloc(sizeof(float) * (size_t)rows * n), *y = malloc(sizeof(float) * (size_t)rows * n);
    unsigned char *b = malloc(rb * (size_t)rows);
    FILE *f = fopen(argv[4], "rb");
    if (!x || !y || !b || !f || fread(x, sizeof(float), (size_t)rows * n, f) != (size_t)rows * n) {
        fprintf(stderr, "kvquant_tool: cannot read %d x %d floats from %s\n", rows, n, argv[4]);
        return 1;
    }
    fclose(f);
    for (int r = 0; r < rows; r++) {
        kvs_cache_from_f32(ct, x + (size_t)r * n, b + rb * (size_t)r, n);
        kvs_cache_to_f32(ct, b + rb * (size_t)r, y + (size_t)r * n, n);
    }
    FILE *ob = fopen(argv[5], "wb"), *oy = fopen(argv[6], "wb");
    if (!ob || !oy || fwrite(b, rb, (size_t)rows, ob) != (size_t)rows ||
        fwrite(y, sizeof(float), (size_t)rows * n, oy) != (size_t)rows * n) {
        fprintf(stderr, "kvquant_tool: cannot write the outputs\n");
        return 1;
    }
    fclose(ob);
    fclose(oy);
    free(x), free(y), free(b);
    return 0;
}
