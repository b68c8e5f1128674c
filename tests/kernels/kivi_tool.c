/*
 * kivi_tool.c -- a test helper (not a test): runs the KIVI store of
 * kernels/kivi.h on raw fp32 K and V so another implementation (kvsieve-hf's
 * torch path, tests/hf) can be compared with it element for element.
 *
 *   kivi_tool k_bits v_bits group residual f16|bf16|f32 flushed T d in out
 *
 * in: K then V, [T][d] fp32 each (native byte order); out: the store's
 * dequantised K then V, the same shape. Prints "kq vq bytes" on stdout.
 * Exits 1 with the library's message on any error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kivi.h"

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: kivi_tool k_bits v_bits group residual f16|bf16|f32 flushed T d "
                        "in out\n");
        return 1;
    }
    kvs_kivi_config c = kvs_kivi_config_default(atoi(argv[1]));
    c.v_bits = atoi(argv[2]);
    c.group = atoi(argv[3]);
    c.residual = atoi(argv[4]);
    c.residual_dtype = !strcmp(argv[5], "f32") ? KVS_F32 : !strcmp(argv[5], "bf16") ? KVS_BF16
                                                                                     : KVS_F16;
    const int flushed = atoi(argv[6]), T = atoi(argv[7]), d = atoi(argv[8]);
    if (T < 1 || d < 1) {
        fprintf(stderr, "kivi_tool: T = %d, d = %d\n", T, d);
        return 1;
    }
    const size_t n = (size_t)T * d;
    float *buf = malloc(4 * n * sizeof(float));
    FILE *f = fopen(argv[9], "rb");
    if (!buf || !f || fread(buf, sizeof(float), 2 * n, f) != 2 * n) {
        fprintf(stderr, "kivi_tool: cannot read %zu floats from %s\n", 2 * n, argv[9]);
        return 1;
    }
    fclose(f);
    kvs_err err = {0};
    kvs_kivi_head *h = NULL;
    kvs_view k = kvs_view_make(buf, KVS_F32, 1, T, d), v = kvs_view_make(buf + n, KVS_F32, 1, T, d);
    if (kvs_kivi_init(&h, &c, d, T, &err) || kvs_kivi_append(h, &k, &v, 0, 0, T, &err)) {
        fprintf(stderr, "kivi_tool: %s\n", err.msg);
        return 1;
    }
    if (flushed) kvs_kivi_flush(h);
    kvs_kivi_dequantize(h, buf + 2 * n, buf + 3 * n);
    f = fopen(argv[10], "wb");
    if (!f || fwrite(buf + 2 * n, sizeof(float), 2 * n, f) != 2 * n || fclose(f)) {
        fprintf(stderr, "kivi_tool: cannot write %s\n", argv[10]);
        return 1;
    }
    const kvs_kivi_bytes b = kvs_kivi_stats(h);
    printf("%d %d %zu\n", b.k_quantized, b.v_quantized, b.total);
    kvs_kivi_free(h);
    free(buf);
    return 0;
}
