/*
 * test_backend_kivi_model.c -- greedy decoding with kivi4 and kivi2 KV caches
 * against the f16 cache on a real model (argv[1], default "smollm2-135m";
 * exit 77 = SKIPPED when it is not installed): the ten prompts of
 * greedy_model.c, 16 greedy tokens each, the full cache and SnapKV at 0.25.
 * G = 32 and R = 32 (KIVI's R = 128 would leave these short prompts wholly in
 * the fp16 window).
 *
 * Prints per cache type how many generated tokens differ from f16's at the
 * same position, how many continuations are identical and where the first
 * difference lies on average. Checks only what must hold: every run
 * completes, every logit is finite, and the stats' bytes equal the layout's
 * count (per KV head: codes, fp16 scales and zeros, the fp16 window) for the
 * rows each layer holds.
 */
#include <stdio.h>

#include "greedy_model.h"
#include "test_util.h"

enum { GEN = 16, G = 32, R = 32 };

/* Bytes of one KV head holding T tokens (flushed store), from the layout. */
static int64_t head_bytes(int T, int d, int kb, int vb) {
    const int64_t kq = (int64_t)R * (T / R), vq = T > R ? T - R : 0, groups = (d + G - 1) / G;
    return kq / G * ((d * G * kb + 7) / 8) + kq / G * d * 4 + vq * ((d * vb + 7) / 8) + vq * groups * 4 +
           (T - kq + T - vq) * d * 2;
}

int main(int argc, char **argv) {
    kvs_err err = {0};
    int skip = 0, bad = 0;
    kvs_model *m = gm_model_load(argc, argv, "smollm2-135m", &skip, &err);
    if (skip) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    CHECK_MSG(m != NULL, "load: %s", err.msg);
    if (!m) return kvs_test_finish("backend_kivi_model");
    const kvs_model_info *I = kvs_model_get_info(m);
    static const int types[2] = {KVS_CACHE_KIVI4, KVS_CACHE_KIVI2};
    static const char *methods[2] = {NULL, "snapkv"};
    int32_t ref[2][GM_NP][GEN], got[GEN];
    int ok16[2][GM_NP];
    kvs_kv_stats st;
    printf("%s (%s, head_dim %d): %d prompts x %d greedy tokens, G %d, R %d; tokens differing from the f16 "
           "cache's\n", I->name, I->arch, I->head_dim, GM_NP, GEN, G, R);
    for (int mi = 0; mi < 2; mi++)
        for (int p = 0; p < GM_NP; p++) {
            gm_run r = {KVS_CACHE_F16, methods[mi], 0.25, GEN, G, R};
            ok16[mi][p] = gm_generate(m, &r, GM_PROMPTS[p], ref[mi][p], &st, &bad, &err);
            CHECK_MSG(ok16[mi][p], "prompt %d f16: %s", p, err.msg);
        }
    for (int mi = 0; mi < 2; mi++)
        for (int ti = 0; ti < 2; ti++) {
            gm_tally t = {0};
            gm_run r = {types[ti], methods[mi], 0.25, GEN, G, R};
            for (int p = 0; p < GM_NP; p++) {
                if (!ok16[mi][p] || !gm_generate(m, &r, GM_PROMPTS[p], got, &st, &bad, &err)) {
                    CHECK_MSG(0, "prompt %d %s: %s", p, kvs_cache_type_name(types[ti]), err.msg);
                    continue;
                }
                const int kb = types[ti] == KVS_CACHE_KIVI2 ? 2 : 4;
                int64_t want = 0;
                for (int l = 0; l < st.n_layers; l++) /* snapkv keeps equal counts per head */
                    want += I->n_kv_heads * head_bytes((int)st.tokens_after[l], I->head_dim, kb, kb);
                CHECK_EQ_INT(st.bytes_after_total, want);
                gm_tally_add(&t, got, ref[mi][p], GEN);
            }
            gm_tally_print(&t, methods[mi] ? "snapkv" : "full", kvs_cache_type_name(types[ti]));
        }
    CHECK_MSG(bad == 0, "%d non-finite logits or out-of-range tokens", bad);
    kvs_model_free(m);
    return kvs_test_finish("backend_kivi_model");
}
