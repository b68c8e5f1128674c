/*
 * test_backend_tokenizer.c -- the SentencePiece-style tokenizer on the tiny
 * model's vocabulary (see tiny_model.c for the ids): merges by score worked
 * out by hand, byte fallback, control and user-defined tokens, pieces,
 * detokenisation round trips over random strings, end-of-generation tokens
 * and the gemma chat template.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"
#include "tiny_model.h"

static int toks_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static void print_toks(const char *what, const int32_t *t, int n) {
    fprintf(stderr, "%s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", t[i]);
    fprintf(stderr, "\n");
}

#define EXPECT(model, text, bos, special, ...)                                              \
    do {                                                                                    \
        int32_t _want[] = {__VA_ARGS__};                                                    \
        int32_t *_got = NULL;                                                               \
        int _n = 0;                                                                         \
        CHECK_OK(kvs_tokenize(model, text, strlen(text), bos, special, &_got, &_n, &err), &err); \
        int _ok = toks_eq(_got, _n, _want, (int)(sizeof _want / sizeof _want[0]));         \
        CHECK_MSG(_ok, "tokenize(\"%s\")", text);                                           \
        if (!_ok) print_toks("  got", _got, _n);                                            \
        free(_got);                                                                         \
    } while (0)

/* byte-level BPE (tiny qwen2 model): ids 3 + byte for byte symbols, 259 + i for merge i */
static void bpe(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2");
    sp.bpe = 1;
    const char *path = "backend_tokenizer_bpe.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    CHECK_OK(kvs_model_load(path, NULL, &m, &err), &err);
    if (!m) return;
    /* "hello" merges to 262 (rank 3), " world" to 267 (rank 8) */
    EXPECT(m, "hello world", 1, 0, 262, 267);
    /* qwen2 pre-tokeniser: one digit per piece */
    EXPECT(m, "x12", 0, 0, 3 + 'x', 3 + '1', 3 + '2');
    /* contraction, punctuation run with newlines, whitespace runs */
    EXPECT(m, "he's", 0, 0, 259, 3 + '\'', 3 + 's');
    EXPECT(m, "hi!!\n\nok", 0, 0, 3 + 'h', 3 + 'i', 3 + '!', 3 + '!', 3 + '\n', 3 + '\n', 3 + 'o', 3 + 'k');
    EXPECT(m, "a  world", 0, 0, 3 + 'a', 3 + ' ', 267);
    EXPECT(m, "<|im_start|>hello", 0, 1, 1, 262);
    EXPECT(m, "\xc3\xa9", 0, 0, 3 + 0xC3, 3 + 0xA9);
    CHECK_EQ_INT(kvs_model_special(m)->eot, 2);
    CHECK(kvs_token_is_eog(m, 2));
    char buf[16];
    CHECK_EQ_INT(kvs_token_to_piece(m, 267, 0, buf, sizeof buf), 6);
    CHECK(!memcmp(buf, " world", 6));
    static const char *parts[] = {"hello", " ", "world", "\xc3\xa9", "\n", "!", "12345", "\xe6\x97\xa5", "  ",
                                  "'re", "\t", "x"};
    uint64_t rng = 11;
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        char text[512] = "";
        int np = 1 + (int)(kvs_rng_next(&rng) % 12);
        for (int i = 0; i < np; i++) strcat(text, parts[kvs_rng_next(&rng) % (sizeof parts / sizeof parts[0])]);
        int32_t *t = NULL;
        int n = 0;
        char *back = NULL;
        CHECK_OK(kvs_tokenize(m, text, strlen(text), 0, 0, &t, &n, &err), &err);
        CHECK_OK(kvs_detokenize(m, t, n, 0, &back, &err), &err);
        if (!back || strcmp(back, text)) {
            if (!bad) fprintf(stderr, "bpe round trip: '%s' -> '%s'\n", text, back ? back : "(null)");
            bad++;
        }
        free(back);
        free(t);
    }
    CHECK_EQ_INT(bad, 0);
    kvs_chat_msg msgs[2] = {{"system", "S"}, {"user", "U"}};
    char *chat = NULL;
    CHECK_OK(kvs_chat_apply(m, msgs, 2, 1, &chat, &err), &err);
    if (chat)
        CHECK_MSG(!strcmp(chat, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"),
                  "chatml: %s", chat);
    free(chat);
    kvs_model_free(m);
    remove(path);
}

int main(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("gemma3");
    const char *path = "backend_tokenizer_tiny.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    CHECK_OK(kvs_model_load(path, NULL, &m, &err), &err);
    if (!m) return kvs_test_finish("backend_tokenizer");
    const kvs_special_tokens *st = kvs_model_special(m);
    CHECK_EQ_INT(st->bos, 2);
    CHECK_EQ_INT(st->eos, 1);
    CHECK_EQ_INT(st->eot, 5);
    CHECK(st->add_bos);
    CHECK(kvs_token_is_eog(m, 1) && kvs_token_is_eog(m, 5) && !kvs_token_is_eog(m, 267));
    /* "the cat": merges ▁c, he, the, at, ▁cat (by score) */
    EXPECT(m, "the cat", 1, 0, 2, 267, 284);
    EXPECT(m, "the cat", 0, 0, 267, 284);
    /* byte fallback: é = C3 A9; 'b' has no piece */
    EXPECT(m, "\xc3\xa9", 0, 0, 6 + 0xC3, 6 + 0xA9);
    /* user-defined "  " always matches; control tokens only when parse_special */
    EXPECT(m, "a  b", 0, 0, 274, 294, 6 + 'b');
    EXPECT(m, "<start_of_turn>the", 0, 1, 4, 267);
    EXPECT(m, "<eos>", 0, 0, 6 + '<', 271, 276, 277, 6 + '>');
    EXPECT(m, "", 1, 0, 2);
    /* a malformed UTF-8 lead byte must not swallow the space after it (found by fuzzing) */
    EXPECT(m, "\xf1\xf1 a", 0, 0, 6 + 0xF1, 6 + 0xF1, 264);
    /* pieces */
    char buf[64];
    CHECK_EQ_INT(kvs_token_to_piece(m, 284, 0, buf, sizeof buf), 4);
    CHECK(!memcmp(buf, " cat", 4));
    CHECK_EQ_INT(kvs_token_to_piece(m, 6 + 0xC3, 0, buf, sizeof buf), 1);
    CHECK_EQ_INT((unsigned char)buf[0], 0xC3);
    CHECK_EQ_INT(kvs_token_to_piece(m, 4, 0, buf, sizeof buf), 0);
    CHECK_EQ_INT(kvs_token_to_piece(m, 4, 1, buf, sizeof buf), 15);
    CHECK_EQ_INT(kvs_token_to_piece(m, 284, 0, buf, 2), 4); /* too small: size reported */
    CHECK(!strcmp(kvs_token_text(m, 267), "the"));
    CHECK(kvs_token_text(m, -1) == NULL);
    int32_t badt[1] = {100000};
    char *out = NULL;
    CHECK_FAILS(kvs_detokenize(m, badt, 1, 0, &out, &err), KVS_ERR_INVALID, &err, "token 100000");
    /* random round trips */
    static const char *parts[] = {"the", " ", "cat", "\xc3\xa9", "\n", "<", "x", "\xe6\x97\xa5\xe6\x9c\xac",
                                  "  ", "on", "<start_of_turn>", "is a"};
    uint64_t rng = 3;
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        char text[512] = "";
        int np = 1 + (int)(kvs_rng_next(&rng) % 12);
        for (int i = 0; i < np; i++) strcat(text, parts[kvs_rng_next(&rng) % (sizeof parts / sizeof parts[0])]);
        int32_t *t = NULL;
        int n = 0;
        CHECK_OK(kvs_tokenize(m, text, strlen(text), 0, 0, &t, &n, &err), &err);
        char *back = NULL;
        CHECK_OK(kvs_detokenize(m, t, n, 0, &back, &err), &err);
        if (!back || strcmp(back, text)) {
            if (!bad) fprintf(stderr, "round trip: '%s' -> '%s'\n", text, back ? back : "(null)");
            bad++;
        }
        free(back);
        free(t);
    }
    CHECK_EQ_INT(bad, 0);
    /* chat template */
    kvs_chat_msg msgs[3] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}};
    char *chat = NULL;
    CHECK_OK(kvs_chat_apply(m, msgs, 3, 1, &chat, &err), &err);
    if (chat)
        CHECK_MSG(!strcmp(chat, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
                                "<end_of_turn>\n<start_of_turn>model\n"),
                  "chat: %s", chat);
    free(chat);
    kvs_chat_msg badm[1] = {{"robot", "x"}};
    CHECK_FAILS(kvs_chat_apply(m, badm, 1, 1, &chat, &err), KVS_ERR_INVALID, &err, "messages[0].role");
    kvs_model_free(m);
    remove(path);
    bpe();
    return kvs_test_finish("backend_tokenizer");
}
