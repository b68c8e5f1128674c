/*
 * util.c -- monotonic timer and a small deterministic random generator.
 *
 * What it is: kvs_now_ms (CLOCK_MONOTONIC) and splitmix64 with uniform and
 * Box-Muller normal draws. The generator state is the caller's uint64, so the
 * same seed gives the same stream on every machine.
 * What it is not: not a cryptographic generator, no hidden global seed.
 */
#include <string.h>
#include <ctype.h>
#include "kvsieve.h"

#include <math.h>
#include <time.h>

double kvs_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

uint64_t kvs_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double kvs_rng_uniform(uint64_t *state) {
    /* top 53 bits -> [0, 1) with full double resolution */
    return (double)(kvs_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

double kvs_rng_normal(uint64_t *state) {
    /* Box-Muller, two draws per call, no cached second value (the state is one
     * uint64). u1 in (0, 1] so log(u1) is finite. */
    double u1 = 1.0 - kvs_rng_uniform(state);
    double u2 = kvs_rng_uniform(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Levenshtein distance for "did you mean" suggestions (see kvsieve.h). */
int kvs_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1000;
    int prev[64], cur[64]; /* [lb+1] */
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, (lb + 1) * sizeof(int));
    }
    return prev[lb];
}
