/*
 * test_synth_big.c -- the qwen2.5-vl-7b shape at N = 8192 with Nq = 32 and
 * probes: generation must take a few seconds (printed; the check is a
 * generous bound so a loaded machine does not fail it) and the output must
 * be a valid cache. Label "slow": ~1 GB of fp32 K/V.
 */
#include "kvs_formats.h"
#include "test_util.h"

static kvs_err *ep(kvs_err *e) { return e; }

int main(void) {
    kvs_synth_config c;
    kvs_err err;
    kvs_err_clear(&err);
    CHECK_OK(kvs_synth_preset("qwen2.5-vl-7b", &c, &err), ep(&err));
    c.n_tokens = 8192, c.n_queries = 32, c.image_frac = 0.5, c.seed = 3;
    kvs_dense_cache a;
    float **probes = NULL;
    int32_t *outl = NULL;
    double t0 = kvs_now_ms();
    CHECK_OK(kvs_synth_generate(&c, &a, &probes, &outl, &err), ep(&err));
    double ms = kvs_now_ms() - t0;
    printf("synth qwen2.5-vl-7b N=8192 Nq=32 P=%d: %.0f ms (%.0f MB of K+V fp32)\n", c.n_probes, ms,
           2.0 * 28 * 4 * 8192 * 128 * 4 / 1e6);
    CHECK(ms < 60000.0);
    if (err.code == KVS_OK) {
        kvs_cache_view v;
        kvs_layer ls[28];
        kvs_shape sh;
        CHECK_OK(kvs_dense_cache_view(&a, &v, ls, &err), ep(&err));
        CHECK_OK(kvs_cache_validate(&v, &sh, &err), ep(&err));
        CHECK_EQ_INT(sh.n_q_heads, 28);
        CHECK_EQ_INT(sh.n_queries, 32);
        for (int l = 0; l < 28; l++) free(probes[l]);
        free(probes);
        free(outl);
        kvs_dense_cache_free(&a);
    }
    return kvs_test_finish("formats_synth_big");
}
