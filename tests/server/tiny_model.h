/*
 * tiny_model.h -- writes a tiny random-weight gemma3 GGUF for the server tests.
 *
 * What it is: 6 layers (layers 0-4 sliding-window "local", layer 5 global),
 * n_embd 64, 4 query heads, 2 KV heads, head_dim 16, n_ff 128, F32 weights
 * drawn from a fixed seed, and a SentencePiece vocabulary of control tokens,
 * 256 byte tokens, the letters, U+2581 and a few words whose every prefix
 * is a token (so "hello world" tokenises to two word tokens). Test-only; the
 * engine's own tests have theirs.
 * What it is not: a meaningful language model.
 */
#ifndef KVS_TEST_TINY_MODEL_H
#define KVS_TEST_TINY_MODEL_H

#include "kvs_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY_LAYERS 6
#define TINY_EMBD 64
#define TINY_HEADS 4
#define TINY_KV_HEADS 2
#define TINY_HEAD_DIM 16
#define TINY_FF 128
#define TINY_WINDOW 16

static kvs_status tiny_add_matrix(kvs_gguf_writer *w, const char *name, int cols, int rows, double sd,
                                  double fill, uint64_t *rng, kvs_err *err) {
    float *x = malloc((size_t)cols * (size_t)rows * sizeof *x); /* [rows][cols] */
    if (!x) return kvs_errorf(err, KVS_ERR_NOMEM, "tiny model: no memory for %s", name);
    for (size_t i = 0; i < (size_t)cols * (size_t)rows; i++)
        x[i] = sd > 0 ? (float)(sd * kvs_rng_normal(rng)) : (float)fill;
    int64_t ne[2] = {cols, rows};
    kvs_status st = kvs_gguf_writer_add_tensor(w, name, KVS_GGML_F32, rows > 1 ? 2 : 1, ne, x, err);
    free(x);
    return st;
}

/* Writes the model to path; *n_vocab receives the vocabulary size. */
static kvs_status tiny_model_write(const char *path, uint64_t seed, int *n_vocab, kvs_err *err) {
    enum { MAXV = 400 };
    char *tok_store = malloc(MAXV * 16);
    const char *toks[MAXV];
    float scores[MAXV];
    int32_t types[MAXV];
    int V = 0;
    kvs_gguf_writer *w = NULL;
    kvs_status st = KVS_OK;
    if (!tok_store) return kvs_errorf(err, KVS_ERR_NOMEM, "tiny model: no memory");
#define ADD_TOK(text, score, type)                                  \
    do {                                                            \
        snprintf(tok_store + 16 * V, 16, "%s", text);               \
        toks[V] = tok_store + 16 * V;                               \
        scores[V] = (float)(score);                                 \
        types[V] = (type);                                          \
        V++;                                                        \
    } while (0)
    ADD_TOK("<pad>", 0, 3);
    ADD_TOK("<eos>", 0, 3);
    ADD_TOK("<bos>", 0, 3);
    ADD_TOK("<unk>", 0, 2);
    ADD_TOK("<start_of_turn>", 0, 3);
    ADD_TOK("<end_of_turn>", 0, 3);
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        ADD_TOK(t, 0, 6);
    }
    ADD_TOK("\xe2\x96\x81", -1, 1); /* U+2581, the SentencePiece space */
    for (char c = 'a'; c <= 'z'; c++) {
        char t[2] = {c, 0};
        ADD_TOK(t, -2, 1);
    }
    /* every prefix of "\u2581word" is a token, scored by length, so the
     * pairwise merges build each word left to right */
    static const char *const words[] = {"hello", "world", "the", "in", "is", "it", "at", "an", "on"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        for (size_t k = 1; k <= strlen(words[i]); k++) {
            char t[16];
            snprintf(t, sizeof t, "\xe2\x96\x81%.*s", (int)k, words[i]);
            int dup = 0;
            for (int j = 0; j < V; j++) dup |= strcmp(toks[j], t) == 0;
            if (!dup) ADD_TOK(t, 10.0 + (double)k, 1);
        }
    }
    ADD_TOK("model", 3, 1);
    ADD_TOK("user", 3, 1);
    ADD_TOK("\n", 1, 1);
#undef ADD_TOK
    uint64_t rng = seed;
    char name[64];
    if ((st = kvs_gguf_writer_new(&w, err))) goto cleanup;
    if ((st = kvs_gguf_writer_add_str(w, "general.architecture", "gemma3", err)) ||
        (st = kvs_gguf_writer_add_str(w, "general.name", "tiny-gemma3-test", err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.block_count", TINY_LAYERS, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.embedding_length", TINY_EMBD, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.feed_forward_length", TINY_FF, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.attention.head_count", TINY_HEADS, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.attention.head_count_kv", TINY_KV_HEADS, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.attention.key_length", TINY_HEAD_DIM, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.attention.value_length", TINY_HEAD_DIM, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.context_length", 512, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "gemma3.attention.sliding_window", TINY_WINDOW, err)) ||
        (st = kvs_gguf_writer_add_f32(w, "gemma3.attention.layer_norm_rms_epsilon", 1e-6f, err)) ||
        (st = kvs_gguf_writer_add_f32(w, "gemma3.rope.freq_base", 1e6f, err)) ||
        (st = kvs_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", err)) ||
        (st = kvs_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, V, err)) ||
        (st = kvs_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, V, err)) ||
        (st = kvs_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, V, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 2, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 1, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 3, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 0, err)) ||
        (st = kvs_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, err)))
        goto cleanup;
    const int E = TINY_EMBD, D = TINY_HEAD_DIM;
    if ((st = tiny_add_matrix(w, "token_embd.weight", E, V, 0.5, 0, &rng, err)) ||
        (st = tiny_add_matrix(w, "output_norm.weight", E, 1, 0, 1.0, &rng, err)))
        goto cleanup;
    for (int l = 0; l < TINY_LAYERS; l++) {
#define T(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        if ((st = tiny_add_matrix(w, T("attn_norm.weight"), E, 1, 0, 1.0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_q.weight"), E, TINY_HEADS * D, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_k.weight"), E, TINY_KV_HEADS * D, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_v.weight"), E, TINY_KV_HEADS * D, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_output.weight"), TINY_HEADS * D, E, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_q_norm.weight"), D, 1, 0, 1.0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("attn_k_norm.weight"), D, 1, 0, 1.0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("post_attention_norm.weight"), E, 1, 0, 1.0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("ffn_norm.weight"), E, 1, 0, 1.0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("ffn_gate.weight"), E, TINY_FF, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("ffn_up.weight"), E, TINY_FF, 0.15, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("ffn_down.weight"), TINY_FF, E, 0.1, 0, &rng, err)) ||
            (st = tiny_add_matrix(w, T("post_ffw_norm.weight"), E, 1, 0, 1.0, &rng, err)))
            goto cleanup;
#undef T
    }
    st = kvs_gguf_writer_write(w, path, err);
    *n_vocab = V;
cleanup:
    kvs_gguf_writer_free(w);
    free(tok_store);
    return st;
}

#endif
