/*
 * test_backend_tokenizer.c -- the SentencePiece-style tokenizer on the tiny
 * model's vocabulary (see tiny_model.c for the ids): merges by score worked
 * out by hand, byte fallback, control and user-defined tokens, pieces,
 * detokenisation round trips over random strings, end-of-generation tokens
 * and the gemma chat template; byte-level BPE on the tiny qwen2 vocabulary,
 * and the pre-tokeniser splits (llama 3, qwen2, GPT-2, smollm) on a copy of it
 * whose header is rewritten (tokenizer.ggml.pre and merges chosen so that
 * each split rule changes the ids). The expected ids of the split tests were
 * worked out by hand from llama.cpp's split regexes (llama-vocab.cpp), then
 * confirmed once by hand with llama.cpp's llama-tokenize (the copy vendored in
 * llama-cpp-python 0.3.36, --ids --no-bos) on the rewritten files, which it
 * loads: every id list below is what it gives, and it too refuses "qwen9"
 * (unknown pre-tokenizer type). Real-model ids are in test_backend_model.c.
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

/* ---- pre-tokeniser splits -------------------------------------------------------- */

/* Merges for the split tests, ids 259 + i; each is a pair that only a split rule can keep apart. The last one,
 * made of 'q's that no test text has, pads the header back to its old length (see rewrite). */
static const char *const SPLIT_MERGES[8] = {
    "\xc4\x8a \xc4\xa0",  /* 259 "\n " */
    "\xc4\x8d \xc4\x8a",  /* 260 "\r\n" */
    "1 2",                /* 261 "12" */
    "' S",                /* 262 "'S" */
    "\xc4\xa0 w",         /* 263 " w" */
    "o r",                /* 264 "or" */
    "\xc4\xa0w or",       /* 265 " wor" */
    "\xc4\xa0 \xc4\xa0",  /* 266 "  " */
};
enum { NL_SP = 259, CR_NL = 260, D12 = 261, Q_S = 262, SP_WOR = 265, SP_SP = 266 };
#define B(c) (3 + (c))

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* GGUF is little endian, as are the hosts we build on */
    return v;
}

/* Offset just past the value type of key in a GGUF header (the key's u64 length, bytes, then u32 type), 0 if
 * absent. */
static size_t find_key(const unsigned char *b, size_t n, const char *key) {
    size_t kl = strlen(key);
    for (size_t i = 8; i + kl + 4 <= n; i++)
        if (!memcmp(b + i, key, kl) && rd64(b + i - 8) == kl) return i + kl + 4;
    return 0;
}

/* Offset past k serialized strings (u64 length + bytes) starting at off. */
static size_t skip_strs(const unsigned char *b, size_t off, int k) {
    for (int i = 0; i < k; i++) off += 8 + (size_t)rd64(b + off);
    return off;
}

static void put_str(unsigned char *o, size_t *on, const char *s, size_t l) {
    uint64_t v = l;
    memcpy(o + *on, &v, 8);
    memcpy(o + *on + 8, s, l);
    *on += 8 + l;
}

/* Copy the tiny BPE model src to dst with tokenizer.ggml.pre = pre, merges SPLIT_MERGES plus a filler, and the
 * tokens 259.. their merged pieces. The header keeps its byte length (the filler's length makes up the
 * difference), so the aligned tensor data that follows it stays valid. Returns 0 on success. */
static int rewrite(const char *src, const char *dst, const char *pre) {
    FILE *f = fopen(src, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n), *o = malloc(n + 256);
    int rc = 1;
    if (!b || !o || fread(b, 1, n, f) != n) goto done;
    size_t kp = find_key(b, n, "tokenizer.ggml.pre"), km = find_key(b, n, "tokenizer.ggml.merges"),
           kt = find_key(b, n, "tokenizer.ggml.tokens");
    /* the tiny model writes them in this order: pre, merges, tokens */
    if (!kp || !km || !kt || !(kp < km && km < kt)) goto done;
    size_t pre_end = skip_strs(b, kp, 1);
    size_t m_start = km + 4 + 8, m_end = skip_strs(b, m_start, TINY_N_MERGES); /* elem type, count */
    size_t t_start = skip_strs(b, kt + 4 + 8, 259), t_end = skip_strs(b, t_start, TINY_N_MERGES);
    if (TINY_N_MERGES != 9 || rd64(b + km + 4) != 9) goto done;
    char pieces[8][16];
    size_t new_len = 8 + strlen(pre), old_len = (pre_end - kp) + (m_end - m_start) + (t_end - t_start);
    for (int i = 0; i < 8; i++) {
        const char *sp = strchr(SPLIT_MERGES[i], ' ');
        snprintf(pieces[i], sizeof pieces[i], "%.*s%s", (int)(sp - SPLIT_MERGES[i]), SPLIT_MERGES[i], sp + 1);
        new_len += 8 + strlen(SPLIT_MERGES[i]) + 8 + strlen(pieces[i]);
    }
    new_len += 8 + 2 + 8; /* token 267 "qq" and the filler merge's length */
    if (old_len < new_len + 3 || old_len - new_len > 200) goto done;
    size_t fl = old_len - new_len;
    char filler[256];
    memset(filler, 'q', fl);
    filler[fl - 2] = ' ';
    size_t on = 0;
    memcpy(o, b, kp);
    on = kp;
    put_str(o, &on, pre, strlen(pre));
    memcpy(o + on, b + pre_end, m_start - pre_end);
    on += m_start - pre_end;
    for (int i = 0; i < 8; i++) put_str(o, &on, SPLIT_MERGES[i], strlen(SPLIT_MERGES[i]));
    put_str(o, &on, filler, fl);
    memcpy(o + on, b + m_end, t_start - m_end);
    on += t_start - m_end;
    for (int i = 0; i < 8; i++) put_str(o, &on, pieces[i], strlen(pieces[i]));
    put_str(o, &on, "qq", 2);
    memcpy(o + on, b + t_end, n - t_end);
    on += n - t_end;
    if (on != n) goto done;
    FILE *g = fopen(dst, "wb");
    if (!g) goto done;
    rc = fwrite(o, 1, n, g) != n;
    rc |= fclose(g) != 0;
done:
    fclose(f);
    free(b);
    free(o);
    return rc;
}

/* Load a copy of tiny with tokenizer.ggml.pre = pre and the split merges; *m is NULL on failure. */
static kvs_status load_with_pre(const char *tiny, const char *pre, kvs_model **m, kvs_err *err) {
    const char *path = "backend_tokenizer_pre.gguf";
    *m = NULL;
    if (rewrite(tiny, path, pre))
        return kvs_errorf(err, KVS_ERR_IO, "%s: rewriting the header for pre '%s' failed", tiny, pre);
    kvs_status st = kvs_model_load(path, NULL, m, err);
    remove(path);
    return st;
}

static void splits(void) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default("qwen2");
    sp.bpe = 1;
    const char *tiny = "backend_tokenizer_split.gguf";
    CHECK_OK(tiny_write(&sp, tiny, &err), &err);
    kvs_model *m;

    /* GPT-2 ("gpt-2") */
    CHECK_OK(load_with_pre(tiny, "gpt-2", &m, &err), &err);
    if (m) {
        /* \s+(?!\S): a newline and two spaces before a word leave the last space to " x" */
        EXPECT(m, "\n  x", 0, 0, NL_SP, B(' '), B('x'));
        /* ... and at the end of the text the whole run is one piece */
        EXPECT(m, "x\n ", 0, 0, B('x'), NL_SP);
        /* "\r\n" before a word: two single-space pieces, never merged */
        EXPECT(m, "a\r\nb", 0, 0, B('a'), B('\r'), B('\n'), B('b'));
        EXPECT(m, "a\r\n", 0, 0, B('a'), CR_NL);
        /* ' ?\p{N}+': a digit run with the space before it is one piece */
        EXPECT(m, "x 123", 0, 0, B('x'), B(' '), D12, B('3'));
        /* contractions are lower case only: "'S" is punctuation then a letter */
        EXPECT(m, "x'S", 0, 0, B('x'), B('\''), B('S'));
        EXPECT(m, "a  world", 0, 0, B('a'), B(' '), SP_WOR, B('l'), B('d'));
        EXPECT(m, " a  ", 0, 0, B(' '), B('a'), SP_SP);
        /* a space before punctuation joins it */
        EXPECT(m, "a  !", 0, 0, B('a'), B(' '), B(' '), B('!'));
        kvs_model_free(m);
    }
    /* smollm: each digit a piece of its own, GPT-2's rules between them (a run ends where a digit starts) */
    CHECK_OK(load_with_pre(tiny, "smollm", &m, &err), &err);
    if (m) {
        EXPECT(m, "x 123", 0, 0, B('x'), B(' '), B('1'), B('2'), B('3'));
        EXPECT(m, "a  1", 0, 0, B('a'), SP_SP, B('1'));
        EXPECT(m, "\n  12", 0, 0, NL_SP, B(' '), B('1'), B('2'));
        EXPECT(m, "\n  x", 0, 0, NL_SP, B(' '), B('x'));
        EXPECT(m, "a\r\nb", 0, 0, B('a'), B('\r'), B('\n'), B('b'));
        EXPECT(m, "x'S", 0, 0, B('x'), B('\''), B('S'));
        kvs_model_free(m);
    }
    /* qwen2 on the same vocabulary: llama 3's rules, one digit per piece */
    CHECK_OK(load_with_pre(tiny, "qwen2", &m, &err), &err);
    if (m) {
        EXPECT(m, "\n  x", 0, 0, B('\n'), B(' '), B(' '), B('x'));
        EXPECT(m, "a\r\nb", 0, 0, B('a'), CR_NL, B('b'));
        EXPECT(m, "x'S", 0, 0, B('x'), Q_S);
        EXPECT(m, "x 123", 0, 0, B('x'), B(' '), B('1'), B('2'), B('3'));
        kvs_model_free(m);
    }
    /* llama 3 ("llama-bpe"): digits in groups of up to three, no space before them */
    CHECK_OK(load_with_pre(tiny, "llama-bpe", &m, &err), &err);
    if (m) {
        EXPECT(m, "x 1212", 0, 0, B('x'), B(' '), D12, B('1'), B('2'));
        EXPECT(m, "a\r\nb", 0, 0, B('a'), CR_NL, B('b'));
        kvs_model_free(m);
    }
    /* names we do not implement are refused, as llama.cpp refuses unknown ones ("default" is its own split) */
    CHECK_FAILS(load_with_pre(tiny, "qwen9", &m, &err), KVS_ERR_UNSUPPORTED, &err, "'qwen9'");
    kvs_model_free(m);
    CHECK_FAILS(load_with_pre(tiny, "default", &m, &err), KVS_ERR_UNSUPPORTED, &err,
                "'default'");
    kvs_model_free(m);
    remove(tiny);
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
    splits();
    return kvs_test_finish("backend_tokenizer");
}
