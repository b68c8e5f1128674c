/*
 * fuzz_tokenize.c -- libFuzzer target for the tokenizers: arbitrary bytes
 * through the SentencePiece (tiny gemma3) and byte-level BPE (tiny qwen2)
 * vocabularies of tiny_model.c, with and without special-token parsing.
 * Property: detokenize(tokenize(x)) == x when specials are not parsed (for
 * SentencePiece only when x has no literal U+2581, which it cannot tell from a
 * space). Any crash, sanitizer report or mismatch aborts.
 *
 * Build and run: tests/fuzz/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "tiny_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvs_model *load(const char *arch, int bpe) {
    char path[64];
    snprintf(path, sizeof path, "fuzz_tok_%s.gguf", arch);
    tiny_spec sp = tiny_default(arch);
    sp.bpe = bpe;
    kvs_err err = {0};
    kvs_model *m = NULL;
    if (tiny_write(&sp, path, &err) || kvs_model_load(path, NULL, &m, &err)) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err.msg);
        abort();
    }
    remove(path);
    return m;
}

static void check(const kvs_model *m, const char *text, size_t n, int exact) {
    for (int special = 0; special < 2; special++) {
        int32_t *t = NULL;
        int nt = 0;
        kvs_err err = {0};
        if (kvs_tokenize(m, text, n, 1, special, &t, &nt, &err) != KVS_OK) abort();
        char *back = NULL;
        if (kvs_detokenize(m, t, nt, special, &back, &err) != KVS_OK) abort();
        if (!special && exact && (strlen(back) != n || memcmp(back, text, n))) abort();
        free(back);
        free(t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the models are loaded once and kept for the whole run (read-only) */
    static kvs_model *spm = NULL, *bpe = NULL;
    if (!spm) spm = load("gemma3", 0);
    if (!bpe) bpe = load("qwen2", 1);
    if (memchr(data, 0, size)) return 0; /* detokenised text is NUL-terminated */
    int has_2581 = 0;
    for (size_t i = 0; i + 2 < size; i++)
        if (data[i] == 0xE2 && data[i + 1] == 0x96 && data[i + 2] == 0x81) has_2581 = 1;
    check(spm, (const char *)data, size, !has_2581);
    check(bpe, (const char *)data, size, 1);
    return 0;
}
