/*
 * tiny_model.h -- test helpers of the engine: tiny random-weight GGUF models
 * written with our own writer (gemma3, llama, qwen2 shapes; chosen weight
 * types), a small SentencePiece-style vocabulary, and a float64 reference
 * forward pass written independently of backend/model/session.c.
 */
#ifndef KVS_TINY_MODEL_H
#define KVS_TINY_MODEL_H

#include "kvs_backend.h"

typedef struct {
    const char *arch;   /* "gemma3", "llama", "qwen2" */
    int n_layers, n_embd, n_ff, n_heads, n_kv_heads, head_dim;
    int sliding_window; /* gemma3 only */
    int n_ctx;
    int type_attn;      /* type of attn_q/k/v/output */
    int type_ffn;       /* type of ffn gate/up */
    int type_down;      /* type of ffn_down */
    int type_embd;      /* type of token_embd */
    uint64_t seed;
    int bpe;            /* 1: byte-level BPE vocabulary (gpt2 model, qwen2 pre-tokeniser) */
    float rope_linear;  /* > 0: rope.scaling.type linear with this factor */
    int rope_freqs;     /* 1: write a rope_freqs.weight tensor (frequency divisors) */
} tiny_spec;

/* A spec with small defaults for arch (all weights F32). */
tiny_spec tiny_default(const char *arch);
/* Write the model to path. SentencePiece vocabulary: <pad> <eos> <bos> <unk>
 * <start_of_turn> <end_of_turn> (control), 256 byte tokens, then pieces.
 * BPE vocabulary (bpe = 1): <|endoftext|> <|im_start|> <|im_end|> (control),
 * the 256 byte symbols in byte order (ids 3..258), then the merged pieces of
 * TINY_MERGES in order. */
extern const char *const TINY_MERGES[];
extern const int TINY_N_MERGES;
kvs_status tiny_write(const tiny_spec *s, const char *path, kvs_err *err);

/* float64 reference forward over a loaded model's GGUF: logits [n_vocab] of
 * the last of the n tokens. Reads the tensors and metadata itself.
 * keep (may be NULL) is [L][Hkv][n]: the LAST position's attention in layer l,
 * KV head h only sees earlier positions j with keep[(l*Hkv + h)*n + j] != 0
 * (a compressed prefix cache); every other position attends normally. */
kvs_status ref_forward(const kvs_model *m, const int32_t *toks, int n, const uint8_t *keep, double *logits,
                       kvs_err *err);

#endif
