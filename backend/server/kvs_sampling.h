/*
 * kvs_sampling.h -- choosing the next token from logits, and deciding when to stop.
 *
 * What it is: a sampler (greedy by default; temperature, top-k, top-p with a
 * seeded splitmix64 stream from core) with its scratch allocated once, so the
 * token loop allocates nothing; and the stop rules (stop tokens, stop
 * strings, max tokens) applied to the generated token ids and text.
 * What it is not: no model, no tokenizer, no HTTP. Penalties (repetition,
 * presence) and grammar constraints are not implemented.
 *
 * Order of the sampling transforms (documented in docs/ as well):
 *   temperature <= 0 or top_k == 1  ->  argmax (ties: the lower token id)
 *   otherwise  z = logits / temperature
 *              keep the top_k largest z (top_k == 0: all)
 *              p = softmax over the kept tokens (double precision)
 *              keep the smallest prefix of the kept tokens, by p descending
 *                (ties: lower id first), whose mass reaches top_p (>= 1 token)
 *              draw u = kvs_rng_uniform() * kept mass and walk the prefix.
 */
#ifndef KVS_SAMPLING_H
#define KVS_SAMPLING_H

#include "kvsieve.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double temperature; /* <= 0: greedy */
    int top_k;          /* 0: off */
    double top_p;       /* (0, 1]; 1: off */
    uint64_t seed;      /* initial splitmix64 state */
} kvs_sampling_params;

/* Defaults: greedy (temperature 0), top_k 0, top_p 1, seed 0. */
void kvs_sampling_defaults(kvs_sampling_params *p);
/* Range checks; the message names the field ("temperature", "top_k", "top_p"). */
kvs_status kvs_sampling_check(const kvs_sampling_params *p, kvs_err *err);

typedef struct {
    kvs_sampling_params p;
    int n_vocab;
    uint64_t rng;     /* splitmix64 state */
    int32_t *cand;    /* [n_vocab] candidate token ids */
    double *prob;     /* [n_vocab] candidate values / probabilities */
} kvs_sampler;

kvs_status kvs_sampler_init(kvs_sampler *s, const kvs_sampling_params *p, int n_vocab,
                            kvs_err *err);
void kvs_sampler_free(kvs_sampler *s);
/* Next token from logits [n_vocab]. KVS_ERR_NUMERIC (naming the token id)
 * when a logit is NaN. Allocates nothing. */
kvs_status kvs_sampler_sample(kvs_sampler *s, const float *logits, int32_t *token, kvs_err *err);

/* ---- stop rules --------------------------------------------------------- */

#define KVS_STOP_MAX_TOKENS 64
#define KVS_STOP_MAX_STRINGS 16

typedef struct {
    int n_predict; /* max new tokens (>= 0) */
    int n_tokens;
    int32_t tokens[KVS_STOP_MAX_TOKENS]; /* stop token ids (EOS, end-of-turn, ...) */
    int n_strings;
    char *strings[KVS_STOP_MAX_STRINGS]; /* owned copies, non-empty */
} kvs_stop;

void kvs_stop_init(kvs_stop *s, int n_predict);
void kvs_stop_free(kvs_stop *s);
/* Add a stop token (duplicates ignored) or a stop string (copied). Errors:
 * too many, empty string. The message names the field "stop". */
kvs_status kvs_stop_add_token(kvs_stop *s, int32_t tok, kvs_err *err);
kvs_status kvs_stop_add_string(kvs_stop *s, const char *str, kvs_err *err);
int kvs_stop_is_token(const kvs_stop *s, int32_t tok);

/* After `text` grew from old_len to len bytes: if a stop string now occurs
 * (starting anywhere it could overlap the new bytes), returns its index and
 * sets *cut to the offset where it starts (the earliest such offset);
 * otherwise returns -1. Only the tail that can contain a new match is
 * searched, so a generation costs O(total length * longest stop). */
int kvs_stop_find_string(const kvs_stop *s, const char *text, size_t old_len, size_t len,
                         size_t *cut);

#ifdef __cplusplus
}
#endif
#endif
