/*
 * wo_views.c -- the output projection W_o of the layers a compression reads,
 * as the [Hq][E][d] views of kvs_layer.wo (methods that declare
 * KVS_NEED_W_O: CriticalKV).
 *
 * What it is: one dequantisation of each mapped layer's attn_output weight
 * ([E] rows of Hq*d, any GGUF type the engine reads) into fp32, per
 * compression (E * Hq * d floats per layer; dequantising costs about what
 * one token's W_o product does), and the strided view on it (head i's
 * slice is columns [i*d, (i+1)*d) of every row: s_head = d, s_tok = Hq*d).
 * What it is not: no cache; a compression that does not declare the need
 * never calls it.
 */
#include "engine_private.h"

#include "kvs_cpu.h"

#include <stdlib.h>

kvs_status kvs_model_wo_views(const kvs_model *m, kvs_layer *layers, const int *map, int n,
                              float **buf, kvs_err *err) {
    *buf = NULL;
    const int Hq = m->info.n_heads, D = m->info.head_dim;
    const int64_t E = m->info.n_embd, cols = (int64_t)Hq * D;
    float *b = malloc(sizeof(float) * (size_t)n * (size_t)E * (size_t)cols); /* [n][E][Hq*D] */
    if (!b)
        return kvs_errorf(err, KVS_ERR_NOMEM, "W_o: out of memory for %d layers of [%lld][%lld]", n,
                          (long long)E, (long long)cols);
    for (int i = 0; i < n; i++) {
        const kvs_wmat *w = &m->layers[map[i]].wo;
        if (w->rows != E || w->cols != cols) {
            free(b);
            return kvs_errorf(err, KVS_ERR_FORMAT, "W_o: layer %d: attn_output is [%lld][%lld], expected [%lld][%lld]",
                              map[i], (long long)w->rows, (long long)w->cols, (long long)E, (long long)cols);
        }
        float *dst = b + (size_t)i * (size_t)E * (size_t)cols;
        for (int64_t r = 0; r < E; r++) {
            kvs_status st = kvs_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                                            dst + (size_t)r * (size_t)cols, cols, err);
            if (st) {
                free(b);
                return kvs_err_prefix(err, "W_o: layer %d row %lld", map[i], (long long)r);
            }
        }
        layers[i].wo = (kvs_view){dst, KVS_F32, KVS_HOST, Hq, (int)E, D, D, cols};
    }
    *buf = b;
    return KVS_OK;
}
