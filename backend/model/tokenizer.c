/*
 * tokenizer.c -- the tokenizer read from the GGUF metadata, special tokens,
 * and chat templates.
 *
 * What it is: SentencePiece-style tokenisation (tokenizer.ggml.model =
 * "llama": spaces become U+2581, UTF-8 characters are merged pairwise by the
 * highest vocabulary score, characters outside the vocabulary fall back to
 * <0xNN> byte tokens), special-token partitioning (user-defined tokens always,
 * control tokens when asked, longest match first), detokenisation, and the
 * chat templates of gemma, llama 2/3 and ChatML (qwen2); byte-level BPE
 * (tokenizer.ggml.model = "gpt2"): bytes mapped to printable code points as
 * GPT-2 does, a pre-tokeniser chosen by tokenizer.ggml.pre the way llama.cpp
 * chooses it (llama 3's split, qwen2's = llama 3's with one digit per piece,
 * GPT-2's, smollm's = GPT-2's after isolating every digit), then merges by
 * rank. A pre-tokeniser name we do not implement is refused at load, never
 * replaced by a different split.
 * What it is not: a full Unicode database. The pre-tokeniser classifies ASCII
 * exactly; other code points are letters except the common space and
 * punctuation blocks (U+00A0-U+00BF, U+2000-U+206F, U+3000-U+303F,
 * U+FF00-U+FF0F), so rare scripts' digits or symbols may split differently
 * from the reference implementation.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_private.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

struct kvs_tokenizer {
    int n;             /* vocabulary size */
    char *text;        /* all token strings, NUL-separated */
    uint32_t *off;     /* [n] offset of each token in text */
    uint32_t *len;     /* [n] byte length */
    float *score;      /* [n] */
    int32_t *type;     /* [n] */
    int32_t *ht;       /* open-addressing hash: token ids, -1 empty */
    uint32_t ht_mask;
    int32_t *spec;     /* special token ids grouped by first byte, each group by length descending */
    int n_spec;
    int spec_start[257]; /* spec[spec_start[b] .. spec_start[b+1]) start with byte b */
    int32_t byte_tok[256];
    int add_space_prefix;
    int32_t eog[8];
    int n_eog;
    int family;        /* template family */
    int bpe;           /* 1: byte-level BPE (gpt2), 0: SentencePiece */
    int pre;           /* BPE pre-tokeniser split: PRE_* */
    const kvs_gguf_str *merges; /* [n_merges] "left right", in the mapping */
    int n_merges;
    int32_t *mh;       /* hash of merges -> rank, -1 empty */
    uint32_t mh_mask;
    uint16_t byte_cp[256]; /* byte -> code point (GPT-2 mapping) */
    int16_t cp_byte[512];  /* code point -> byte, -1 if none */
};

enum { FAM_GEMMA = 1, FAM_LLAMA2 = 2, FAM_LLAMA3 = 3, FAM_CHATML = 4 };

/* BPE pre-tokeniser splits, named after llama.cpp's LLAMA_VOCAB_PRE_TYPE_*:
 * LLAMA3  (?:'s|'t|'re|'ve|'m|'ll|'d, any case)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * QWEN2   LLAMA3 with \p{N} instead of \p{N}{1,3}
 * GPT2    's|'t|'re|'ve|'m|'ll|'d (lower case)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * SMOLLM  every \p{N} code point is a piece of its own, the text between them is split by GPT2 */
enum { PRE_LLAMA3 = 1, PRE_QWEN2 = 2, PRE_GPT2 = 3, PRE_SMOLLM = 4 };

/* tokenizer.ggml.pre names mapped to the split llama.cpp (llama-vocab.cpp) uses for them: the names we test
 * (llama-bpe, qwen2, gpt-2, smollm) and a few aliases llama.cpp gives the very same regexes. Any other name is
 * refused at load, as llama.cpp refuses a name it does not know: there is no fallback. llama.cpp falls back
 * only for a missing name, to its DEFAULT split (punctuation runs, then GPT2, then digit runs, then groups of
 * three digits), the same as "default": not implemented here, so both are refused too rather than split by
 * another rule. Per-name settings of llama.cpp other than the split (ignore_merges for llama 3 names,
 * clean_spaces in detokenisation) are not mirrored. */
static const struct {
    const char *name;
    int pre;
} PRE_NAMES[] = {
    {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3}, {"llama-bpe", PRE_LLAMA3}, {"dbrx", PRE_LLAMA3},
    {"smaug-bpe", PRE_LLAMA3}, {"qwen2", PRE_QWEN2},  {"deepseek-r1-qwen", PRE_QWEN2}, {"megrez", PRE_QWEN2},
    {"stablelm2", PRE_QWEN2}, {"gpt-2", PRE_GPT2},    {"phi-2", PRE_GPT2},   {"mpt", PRE_GPT2},
    {"olmo", PRE_GPT2},       {"smollm", PRE_SMOLLM}, {"starcoder", PRE_SMOLLM}, {"refact", PRE_SMOLLM},
    {"codeshell", PRE_SMOLLM},
};

static uint32_t fnv(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int32_t lookup(const kvs_tokenizer *t, const char *s, size_t n) {
    uint32_t h = fnv(s, n) & t->ht_mask;
    for (;;) {
        int32_t id = t->ht[h];
        if (id < 0) return -1;
        if (t->len[id] == n && !memcmp(t->text + t->off[id], s, n)) return id;
        h = (h + 1) & t->ht_mask;
    }
}

void kvs_tokenizer_free(kvs_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->ht);
    free(t->spec);
    free(t->mh);
    free(t);
}

static const kvs_tokenizer *TOK(const kvs_model *m) { return m->tok; }

/* Special tokens sorted by (first byte, length descending, id): longest match first. */
typedef struct {
    uint32_t len;
    int32_t id;
    uint8_t first;
} len_id_b;
static int cmp_len_id(const void *a, const void *b) {
    const len_id_b *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* ---- byte-level BPE tables ------------------------------------------------------ */

static int32_t merge_rank(const kvs_tokenizer *t, const char *a, size_t na, const char *b, size_t nb) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < na; i++) h = (h ^ (uint8_t)a[i]) * 16777619u;
    h = (h ^ (uint8_t)' ') * 16777619u;
    for (size_t i = 0; i < nb; i++) h = (h ^ (uint8_t)b[i]) * 16777619u;
    h &= t->mh_mask;
    for (;;) {
        int32_t r = t->mh[h];
        if (r < 0) return -1;
        const kvs_gguf_str *ms = &t->merges[r];
        if (ms->len == na + 1 + nb && !memcmp(ms->s, a, na) && ms->s[na] == ' ' && !memcmp(ms->s + na + 1, b, nb))
            return r;
        h = (h + 1) & t->mh_mask;
    }
}

static kvs_status bpe_load(kvs_tokenizer *t, const kvs_model *m, kvs_err *err) {
    const kvs_gguf_kv *km = kvs_gguf_find_kv(&m->g, "tokenizer.ggml.merges");
    if (!km || km->type != KVS_GGUF_ARRAY || km->arr_type != KVS_GGUF_STRING || km->arr_n > (1u << 24))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing or not a string array",
                          m->info.path);
    char pre[64] = "";
    kvs_gguf_get_str(&m->g, "tokenizer.ggml.pre", pre, sizeof pre, NULL);
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof PRE_NAMES[0] && !t->pre; i++)
        if (!strcmp(pre, PRE_NAMES[i].name)) t->pre = PRE_NAMES[i].pre;
    if (!t->pre)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: tokenizer.ggml.pre '%s' is not a supported pre-tokeniser (supported: llama3, llama-bpe, "
                          "qwen2, gpt-2, smollm and their llama.cpp aliases; a missing name is llama.cpp's 'default' "
                          "split, which is not implemented)",
                          m->info.path, pre);
    t->merges = km->arr_strs;
    t->n_merges = (int)km->arr_n;
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)t->n_merges + 2) cap <<= 1;
    t->mh = malloc((size_t)cap * 4);
    if (!t->mh) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for merges", m->info.path);
    memset(t->mh, 0xff, (size_t)cap * 4);
    t->mh_mask = cap - 1;
    for (int r = 0; r < t->n_merges; r++) {
        const kvs_gguf_str *ms = &t->merges[r];
        const char *sp = ms->len > 1 ? memchr(ms->s + 1, ' ', ms->len - 1) : NULL;
        if (!sp)
            return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%d] has no space separating two pieces",
                              m->info.path, r);
        size_t na = (size_t)(sp - ms->s);
        if (merge_rank(t, ms->s, na, sp + 1, ms->len - na - 1) >= 0) continue; /* duplicate: first rank wins */
        uint32_t h = 2166136261u;
        for (uint64_t i = 0; i < ms->len; i++) h = (h ^ (uint8_t)ms->s[i]) * 16777619u;
        h &= t->mh_mask;
        while (t->mh[h] >= 0) h = (h + 1) & t->mh_mask;
        t->mh[h] = r;
    }
    /* GPT-2 byte <-> code point mapping: printable Latin-1 bytes map to themselves */
    int extra = 0;
    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        t->byte_cp[b] = (uint16_t)(keep ? b : 256 + extra++);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
    return KVS_OK;
}

kvs_status kvs_tokenizer_load(kvs_model *m, kvs_err *err) {
    const kvs_gguf *g = &m->g;
    const char *path = m->info.path;
    char model[32] = "";
    kvs_status st = kvs_gguf_get_str(g, "tokenizer.ggml.model", model, sizeof model, NULL);
    if (st) return kvs_errorf(err, KVS_ERR_FORMAT, "%s: metadata tokenizer.ggml.model is missing", path);
    int bpe = !strcmp(model, "gpt2");
    if (strcmp(model, "llama") != 0 && !bpe)
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "%s: tokenizer '%s' is not supported (supported: 'llama' SentencePiece, 'gpt2' byte-level BPE)",
                          path, model);
    const kvs_gguf_kv *kt = kvs_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const kvs_gguf_kv *ks = kvs_gguf_find_kv(g, "tokenizer.ggml.scores");
    const kvs_gguf_kv *ky = kvs_gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!kt || kt->type != KVS_GGUF_ARRAY || kt->arr_type != KVS_GGUF_STRING || kt->arr_n == 0 ||
        kt->arr_n > (1u << 24))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or not a string array", path);
    int n = (int)kt->arr_n;
    if (ks && (ks->type != KVS_GGUF_ARRAY || ks->arr_type != KVS_GGUF_F32 || ks->arr_n != kt->arr_n))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tokenizer.ggml.scores must be %d f32 values", path, n);
    if (ky && (ky->type != KVS_GGUF_ARRAY || ky->arr_type != KVS_GGUF_I32 || ky->arr_n != kt->arr_n))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tokenizer.ggml.token_type must be %d i32 values", path, n);
    if (n < m->info.n_vocab)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: the vocabulary has %d tokens but token_embd has %d rows", path,
                          n, m->info.n_vocab);
    kvs_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for the tokenizer", path);
    t->n = n;
    t->bpe = bpe;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += kt->arr_strs[i].len + 1;
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    t->text = malloc(total);
    t->off = malloc((size_t)n * 4);
    t->len = malloc((size_t)n * 4);
    t->score = malloc((size_t)n * 4);
    t->type = malloc((size_t)n * 4);
    t->ht = malloc((size_t)cap * 4);
    if (!t->text || !t->off || !t->len || !t->score || !t->type || !t->ht) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for the tokenizer", path);
        goto cleanup;
    }
    if (total > UINT32_MAX) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: vocabulary text too large", path);
        goto cleanup;
    }
    t->ht_mask = cap - 1;
    memset(t->ht, 0xff, (size_t)cap * 4);
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const kvs_gguf_str *s = &kt->arr_strs[i];
        memcpy(t->text + o, s->s, s->len);
        t->text[o + s->len] = 0;
        t->off[i] = (uint32_t)o;
        t->len[i] = (uint32_t)s->len;
        o += s->len + 1;
        if (ks) memcpy(&t->score[i], ks->arr_data + 4 * (size_t)i, 4);
        else t->score[i] = 0;
        if (ky) memcpy(&t->type[i], ky->arr_data + 4 * (size_t)i, 4);
        else t->type[i] = TT_NORMAL;
        if (t->type[i] == TT_BYTE) {
            unsigned b;
            if (s->len == 6 && sscanf(t->text + t->off[i], "<0x%02X>", &b) == 1 && b < 256) t->byte_tok[b] = i;
        }
        /* first id wins for duplicate strings */
        if (lookup(t, s->s, s->len) < 0) {
            uint32_t h = fnv(s->s, s->len) & t->ht_mask;
            while (t->ht[h] >= 0) h = (h + 1) & t->ht_mask;
            t->ht[h] = i;
        }
    }
    {
        int ns = 0;
        for (int i = 0; i < n; i++)
            if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0) ns++;
        len_id_b *li = malloc((size_t)(ns ? ns : 1) * sizeof *li);
        t->spec = malloc((size_t)(ns ? ns : 1) * sizeof *t->spec);
        if (!li || !t->spec) {
            free(li);
            st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for the tokenizer", path);
            goto cleanup;
        }
        ns = 0;
        for (int i = 0; i < n; i++)
            if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER) && t->len[i] > 0)
                li[ns++] = (len_id_b){t->len[i], i, (uint8_t)t->text[t->off[i]]};
        qsort(li, (size_t)ns, sizeof *li, cmp_len_id);
        for (int i = 0; i < ns; i++) t->spec[i] = li[i].id;
        t->n_spec = ns;
        int k = 0;
        for (int b = 0; b <= 256; b++) {
            while (k < ns && li[k].first < b) k++;
            t->spec_start[b] = k;
        }
        free(li);
    }
    int64_t v;
    kvs_special_tokens *sp = &m->special;
    sp->bos = kvs_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v, NULL) == KVS_OK && v >= 0 && v < n ? (int32_t)v : -1;
    sp->eos = kvs_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &v, NULL) == KVS_OK && v >= 0 && v < n ? (int32_t)v : -1;
    sp->unk = kvs_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &v, NULL) == KVS_OK && v >= 0 && v < n ? (int32_t)v : -1;
    sp->pad = kvs_gguf_get_i64(g, "tokenizer.ggml.padding_token_id", &v, NULL) == KVS_OK && v >= 0 && v < n ? (int32_t)v : -1;
    sp->add_bos = kvs_gguf_get_i64(g, "tokenizer.ggml.add_bos_token", &v, NULL) == KVS_OK ? (int)v : 1;
    t->add_space_prefix = kvs_gguf_get_i64(g, "tokenizer.ggml.add_space_prefix", &v, NULL) == KVS_OK ? (int)v : !bpe;
    if (bpe && (st = bpe_load(t, m, err))) goto cleanup;
    sp->eot = -1;
    static const char *eot_names[] = {"<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>"};
    for (size_t i = 0; i < sizeof eot_names / sizeof eot_names[0]; i++) {
        int32_t id = lookup(t, eot_names[i], strlen(eot_names[i]));
        if (id >= 0) {
            if (sp->eot < 0) sp->eot = id;
            if (t->n_eog < 8) t->eog[t->n_eog++] = id;
        }
    }
    if (sp->eos >= 0 && t->n_eog < 8) t->eog[t->n_eog++] = sp->eos;
    if (m->arch == KVS_ARCH_GEMMA3) t->family = FAM_GEMMA;
    else if (lookup(t, "<|start_header_id|>", 19) >= 0) t->family = FAM_LLAMA3;
    else if (lookup(t, "<|im_start|>", 12) >= 0 || m->arch == KVS_ARCH_QWEN2) t->family = FAM_CHATML;
    else t->family = FAM_LLAMA2;
    m->tok = t;
    return KVS_OK;
cleanup:
    kvs_tokenizer_free(t);
    return st;
}

int kvs_token_is_eog(const kvs_model *m, int32_t tok) {
    const kvs_tokenizer *t = TOK(m);
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == tok) return 1;
    return 0;
}

const char *kvs_token_text(const kvs_model *m, int32_t tok) {
    const kvs_tokenizer *t = TOK(m);
    if (tok < 0 || tok >= t->n) return NULL;
    return t->text + t->off[tok];
}

/* ---- SentencePiece-style merge ----------------------------------------------- */

typedef struct {
    int prev, next;
    uint32_t start, n; /* byte range in the buffer; n == 0: merged away */
} sym;

typedef struct {
    int left, right;
    float score;
    uint32_t size;
} bigram;

/* max-heap on (score, then lower left index) */
static int bg_less(const bigram *a, const bigram *b) {
    if (a->score != b->score) return a->score < b->score;
    return a->left > b->left;
}

typedef struct {
    bigram *a;
    int n, cap;
} heap;

static int heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        int c = h->cap ? h->cap * 2 : 64;
        bigram *na = realloc(h->a, (size_t)c * sizeof *na);
        if (!na) return 0;
        h->a = na;
        h->cap = c;
    }
    int i = h->n++;
    h->a[i] = b;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!bg_less(&h->a[p], &h->a[i])) break;
        bigram tmp = h->a[p];
        h->a[p] = h->a[i];
        h->a[i] = tmp;
        i = p;
    }
    return 1;
}

static bigram heap_pop(heap *h) {
    bigram top = h->a[0];
    h->a[0] = h->a[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, b = i;
        if (l < h->n && bg_less(&h->a[b], &h->a[l])) b = l;
        if (r < h->n && bg_less(&h->a[b], &h->a[r])) b = r;
        if (b == i) break;
        bigram tmp = h->a[b];
        h->a[b] = h->a[i];
        h->a[i] = tmp;
        i = b;
    }
    return top;
}

typedef struct {
    int32_t *v;
    int n, cap;
} ivec;

static int iv_push(ivec *v, int32_t x) {
    if (v->n == v->cap) {
        int c = v->cap ? v->cap * 2 : 64;
        int32_t *nv = realloc(v->v, (size_t)c * sizeof *nv);
        if (!nv) return 0;
        v->v = nv;
        v->cap = c;
    }
    v->v[v->n++] = x;
    return 1;
}

static int utf8_len(uint8_t c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

static void try_bigram(const kvs_tokenizer *t, const char *buf, const sym *s, int l, int r, heap *h, int *ok) {
    if (l < 0 || r < 0) return;
    uint32_t n = s[l].n + s[r].n;
    int32_t id = lookup(t, buf + s[l].start, n);
    if (id < 0) return;
    if (!heap_push(h, (bigram){l, r, t->score[id], n})) *ok = 0;
}

/* Tokenise one raw fragment (no special tokens inside). */
static kvs_status spm_fragment(const kvs_tokenizer *t, const char *text, size_t len, int prefix_space,
                               ivec *out, kvs_err *err) {
    kvs_status st = KVS_OK;
    /* spaces -> U+2581 (3 bytes) */
    size_t cap = (len + 1) * 3 + 1;
    char *buf = malloc(cap);
    sym *s = NULL;
    heap h = {0};
    if (!buf) return kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
    size_t bn = 0;
    if (prefix_space) {
        memcpy(buf, "\xe2\x96\x81", 3);
        bn = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + bn, "\xe2\x96\x81", 3);
            bn += 3;
        } else
            buf[bn++] = text[i];
    }
    if (bn == 0) goto cleanup;
    s = malloc(bn * sizeof *s);
    if (!s) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    int ns = 0;
    for (size_t i = 0; i < bn;) {
        /* one UTF-8 character; a malformed sequence is one byte (never swallow what follows) */
        int cl = utf8_len((uint8_t)buf[i]);
        if (i + (size_t)cl > bn) cl = 1;
        for (int k = 1; k < cl; k++)
            if (((uint8_t)buf[i + (size_t)k] & 0xC0) != 0x80) cl = 1;
        s[ns] = (sym){ns - 1, -1, (uint32_t)i, (uint32_t)cl};
        if (ns > 0) s[ns - 1].next = ns;
        ns++;
        i += (size_t)cl;
    }
    int ok = 1;
    for (int i = 1; i < ns; i++) try_bigram(t, buf, s, i - 1, i, &h, &ok);
    while (ok && h.n > 0) {
        bigram b = heap_pop(&h);
        sym *L = &s[b.left], *R = &s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size || L->next != b.right) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = b.left;
        try_bigram(t, buf, s, L->prev, b.left, &h, &ok);
        try_bigram(t, buf, s, b.left, L->next, &h, &ok);
    }
    if (!ok) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    for (int i = 0; i != -1 && i < ns; i = s[i].next) {
        int32_t id = lookup(t, buf + s[i].start, s[i].n);
        if (id >= 0 && t->type[id] != TT_BYTE) {
            if (!iv_push(out, id)) ok = 0;
        } else {
            for (uint32_t k = 0; k < s[i].n; k++) {
                int32_t bt = t->byte_tok[(uint8_t)buf[s[i].start + k]];
                if (bt < 0) bt = id >= 0 ? id : -1;
                if (bt < 0) {
                    st = kvs_errorf(err, KVS_ERR_INVALID,
                                    "tokenizer: byte 0x%02x at offset %u has no token and the vocabulary has no byte fallback",
                                    (uint8_t)buf[s[i].start + k], s[i].start + k);
                    goto cleanup;
                }
                if (!iv_push(out, bt)) ok = 0;
            }
        }
        if (s[i].next == -1) break;
    }
    if (!ok) st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
cleanup:
    free(buf);
    free(s);
    free(h.a);
    return st;
}

/* ---- byte-level BPE ------------------------------------------------------------- */

/* Decode one UTF-8 code point at s[i] (invalid bytes count as one code point
 * equal to the byte). Returns its byte length. */
static int utf8_cp(const char *s, size_t n, size_t i, uint32_t *cp) {
    uint8_t c = (uint8_t)s[i];
    int l = utf8_len(c);
    if (l == 1 || i + (size_t)l > n) {
        *cp = c;
        return 1;
    }
    uint32_t v = c & (l == 2 ? 0x1F : l == 3 ? 0x0F : 0x07);
    for (int k = 1; k < l; k++) {
        uint8_t cc = (uint8_t)s[i + k];
        if ((cc & 0xC0) != 0x80) {
            *cp = c;
            return 1;
        }
        v = (v << 6) | (cc & 0x3F);
    }
    *cp = v;
    return l;
}

enum { CL_LETTER, CL_NUMBER, CL_SPACE, CL_OTHER };

static int cp_class(uint32_t c) {
    if (c < 128) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CL_LETTER;
        if (c >= '0' && c <= '9') return CL_NUMBER;
        if (c == ' ' || (c >= 9 && c <= 13)) return CL_SPACE;
        return CL_OTHER;
    }
    if (c == 0xA0 || c == 0x85 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
        c == 0x202F || c == 0x205F || c == 0x3000)
        return CL_SPACE;
    if ((c >= 0x80 && c <= 0xBF) || c == 0xD7 || c == 0xF7 || (c >= 0x2000 && c <= 0x206F) ||
        (c >= 0x3000 && c <= 0x303F) || (c >= 0xFF00 && c <= 0xFF0F) || (c >= 0x1F000 && c <= 0x1FAFF))
        return CL_OTHER;
    return CL_LETTER;
}

/* Length in bytes of the pre-token starting at text[i] (llama 3 split rules). */
static size_t pretok_len(const kvs_tokenizer *t, const char *s, size_t n, size_t i) {
    uint32_t c, c2 = 0;
    int l = utf8_cp(s, n, i, &c);
    int cl = cp_class(c), cl2 = -1;
    if (i + (size_t)l < n) {
        utf8_cp(s, n, i + (size_t)l, &c2);
        cl2 = cp_class(c2);
    }
    /* 1. contractions 's 't 're 've 'm 'll 'd (any case) */
    if (c == '\'' && i + 1 < n) {
        char a = (char)(s[i + 1] | 0x20), b = i + 2 < n ? (char)(s[i + 2] | 0x20) : 0;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    }
    /* 2. [^\r\n\p{L}\p{N}]? \p{L}+ */
    size_t j = i;
    if (cl == CL_LETTER) j = i;
    else if (c != '\r' && c != '\n' && cl != CL_NUMBER && cl2 == CL_LETTER) j = i + (size_t)l;
    else j = (size_t)-1;
    if (j != (size_t)-1) {
        while (j < n) {
            uint32_t d;
            int dl = utf8_cp(s, n, j, &d);
            if (cp_class(d) != CL_LETTER) break;
            j += (size_t)dl;
        }
        return j - i;
    }
    /* 3. \p{N}{1,3} (qwen2: \p{N}) */
    if (cl == CL_NUMBER) {
        int max = t->pre == PRE_QWEN2 ? 1 : 3, k = 0;
        j = i;
        while (j < n && k < max) {
            uint32_t d;
            int dl = utf8_cp(s, n, j, &d);
            if (cp_class(d) != CL_NUMBER) break;
            j += (size_t)dl;
            k++;
        }
        return j - i;
    }
    /* 4. ' '? [^\s\p{L}\p{N}]+ [\r\n]* */
    j = i;
    if (c == ' ' && cl2 == CL_OTHER) j = i + 1;
    if (j < n) {
        uint32_t d;
        utf8_cp(s, n, j, &d);
        if (cp_class(d) == CL_OTHER) {
            while (j < n) {
                int dl = utf8_cp(s, n, j, &d);
                if (cp_class(d) != CL_OTHER) break;
                j += (size_t)dl;
            }
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
            return j - i;
        }
    }
    /* whitespace rules 5-7 */
    if (cl == CL_SPACE) {
        size_t e = i, last_nl = (size_t)-1, prev = i;
        while (e < n) {
            uint32_t d;
            int dl = utf8_cp(s, n, e, &d);
            if (cp_class(d) != CL_SPACE) break;
            if (d == '\r' || d == '\n') last_nl = e;
            prev = e;
            e += (size_t)dl;
        }
        if (last_nl != (size_t)-1) return last_nl + 1 - i;  /* 5. \s*[\r\n]+ */
        if (e == n || prev == i) return e - i;               /* 6./7. run at the end, or a single space */
        return prev - i;                                     /* 6. \s+(?!\S): leave the last space */
    }
    return (size_t)l;
}

/* Length in bytes of the pre-token starting at s[i] by GPT-2's split rules; s[0 .. n) is the chunk being split
 * (for smollm, the text between two digits), so a lookahead stops at its end as llama.cpp's does. */
static size_t gpt2_len(const char *s, size_t n, size_t i) {
    uint32_t c, d;
    int l = utf8_cp(s, n, i, &c);
    /* 's 't 're 've 'm 'll 'd, lower case only */
    if (c == '\'' && i + 1 < n) {
        char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    /* ' '? then a run of letters, of numbers, or of other (not space, letter, number) code points */
    size_t j = i;
    int cl = cp_class(c);
    if (c == ' ') {
        j = i + 1;
        cl = -1;
        if (j < n) {
            utf8_cp(s, n, j, &d);
            cl = cp_class(d);
        }
    }
    if (cl == CL_LETTER || cl == CL_NUMBER || cl == CL_OTHER) {
        while (j < n) {
            int dl = utf8_cp(s, n, j, &d);
            if (cp_class(d) != cl) break;
            j += (size_t)dl;
        }
        return j - i;
    }
    /* \s+(?!\S) then \s+: a run of two or more spaces followed by more text leaves its last one to the next
     * piece; at the chunk's end, or a single space, the whole run */
    size_t e = i, prev = i;
    int count = 0;
    while (e < n) {
        int dl = utf8_cp(s, n, e, &d);
        if (cp_class(d) != CL_SPACE) break;
        prev = e;
        e += (size_t)dl;
        count++;
    }
    if (count > 1 && e < n) return prev - i;
    if (count > 0) return e - i;
    return (size_t)l;
}

/* BPE over one pre-token: mapped code points merged by rank. */
static kvs_status bpe_word(const kvs_tokenizer *t, const char *w, size_t wn, ivec *out, kvs_err *err) {
    kvs_status st = KVS_OK;
    char *buf = malloc(wn * 2 + 1); /* each byte maps to a code point of <= 2 UTF-8 bytes */
    sym *sy = malloc((wn + 1) * sizeof *sy);
    heap h = {0};
    if (!buf || !sy) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    size_t bn = 0;
    int ns = 0;
    for (size_t i = 0; i < wn; i++) {
        uint16_t cp = t->byte_cp[(uint8_t)w[i]];
        uint32_t start = (uint32_t)bn;
        if (cp < 0x80) buf[bn++] = (char)cp;
        else {
            buf[bn++] = (char)(0xC0 | (cp >> 6));
            buf[bn++] = (char)(0x80 | (cp & 0x3F));
        }
        sy[ns] = (sym){ns - 1, -1, start, (uint32_t)bn - start};
        if (ns > 0) sy[ns - 1].next = ns;
        ns++;
    }
    int ok = 1;
    for (int i = 1; i < ns; i++) {
        int32_t r = merge_rank(t, buf + sy[i - 1].start, sy[i - 1].n, buf + sy[i].start, sy[i].n);
        if (r >= 0 && !heap_push(&h, (bigram){i - 1, i, -(float)r, sy[i - 1].n + sy[i].n})) ok = 0;
    }
    while (ok && h.n > 0) {
        bigram b = heap_pop(&h);
        sym *L = &sy[b.left], *R = &sy[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size || L->next != b.right) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = b.left;
        if (L->prev >= 0) {
            sym *P = &sy[L->prev];
            int32_t r = merge_rank(t, buf + P->start, P->n, buf + L->start, L->n);
            if (r >= 0 && !heap_push(&h, (bigram){L->prev, b.left, -(float)r, P->n + L->n})) ok = 0;
        }
        if (L->next >= 0) {
            sym *N = &sy[L->next];
            int32_t r = merge_rank(t, buf + L->start, L->n, buf + N->start, N->n);
            if (r >= 0 && !heap_push(&h, (bigram){b.left, L->next, -(float)r, L->n + N->n})) ok = 0;
        }
    }
    for (int i = 0; ok && i >= 0 && i < ns; i = sy[i].next) {
        int32_t id = lookup(t, buf + sy[i].start, sy[i].n);
        if (id < 0) {
            /* not in the vocabulary: emit its bytes' single-symbol tokens */
            for (uint32_t k = 0; k < sy[i].n;) {
                int cl = utf8_len((uint8_t)buf[sy[i].start + k]);
                int32_t bid = lookup(t, buf + sy[i].start + k, (size_t)cl);
                if (bid < 0) {
                    st = kvs_errorf(err, KVS_ERR_INVALID, "tokenizer: byte symbol '%.*s' is not in the vocabulary", cl,
                                    buf + sy[i].start + k);
                    goto cleanup;
                }
                if (!iv_push(out, bid)) ok = 0;
                k += (uint32_t)cl;
            }
        } else if (!iv_push(out, id))
            ok = 0;
        if (sy[i].next == -1) break;
    }
    if (!ok) st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
cleanup:
    free(buf);
    free(sy);
    free(h.a);
    return st;
}

/* Split one chunk by the llama 3 / qwen2 or GPT-2 rules and merge each piece. */
static kvs_status bpe_chunk(const kvs_tokenizer *t, const char *text, size_t len, ivec *out, kvs_err *err) {
    size_t i = 0;
    while (i < len) {
        size_t l = t->pre == PRE_LLAMA3 || t->pre == PRE_QWEN2 ? pretok_len(t, text, len, i) : gpt2_len(text, len, i);
        assert(l > 0);
        kvs_status st = bpe_word(t, text + i, l, out, err);
        if (st) return st;
        i += l;
    }
    return KVS_OK;
}

static kvs_status bpe_fragment(const kvs_tokenizer *t, const char *text, size_t len, ivec *out, kvs_err *err) {
    if (t->pre != PRE_SMOLLM) return bpe_chunk(t, text, len, out, err);
    /* smollm: llama.cpp first isolates each \p{N} code point, then splits the text between by GPT-2's rules */
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        int dl = 0;
        while (j < len) {
            uint32_t d;
            dl = utf8_cp(text, len, j, &d);
            if (cp_class(d) == CL_NUMBER) break;
            j += (size_t)dl;
        }
        kvs_status st = j > i ? bpe_chunk(t, text + i, j - i, out, err) : KVS_OK;
        if (!st && j < len) st = bpe_word(t, text + j, (size_t)dl, out, err);
        if (st) return st;
        i = j < len ? j + (size_t)dl : j;
    }
    return KVS_OK;
}

kvs_status kvs_tokenize(const kvs_model *m, const char *text, size_t len, int add_bos, int parse_special,
                        int32_t **out, int *n_out, kvs_err *err) {
    const kvs_tokenizer *t = TOK(m);
    *out = NULL;
    *n_out = 0;
    ivec v = {0};
    kvs_status st = KVS_OK;
    if (add_bos && m->special.add_bos && m->special.bos >= 0 && !iv_push(&v, m->special.bos)) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    size_t frag = 0, i = 0;
    int first = 1;
    while (i <= len) {
        int32_t hit = -1;
        if (i < len) {
            uint8_t fb = (uint8_t)text[i];
            for (int k = t->spec_start[fb]; k < t->spec_start[fb + 1]; k++) {
                int32_t id = t->spec[k];
                if (t->type[id] == TT_CONTROL && !parse_special) continue;
                uint32_t l = t->len[id];
                if (l <= len - i && t->text[t->off[id]] == text[i] && !memcmp(t->text + t->off[id], text + i, l)) {
                    hit = id;
                    break;
                }
            }
        }
        if (hit >= 0 || i == len) {
            if (i > frag) {
                int prefix = t->add_space_prefix && first;
                st = t->bpe ? bpe_fragment(t, text + frag, i - frag, &v, err)
                            : spm_fragment(t, text + frag, i - frag, prefix, &v, err);
                if (st) goto cleanup;
            }
            first = 0;
            if (hit < 0) break;
            if (!iv_push(&v, hit)) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
                goto cleanup;
            }
            i += t->len[hit];
            frag = i;
        } else
            i++;
    }
    *out = v.v ? v.v : malloc(sizeof(int32_t));
    if (!*out) return kvs_errorf(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
    *n_out = v.n;
    return KVS_OK;
cleanup:
    free(v.v);
    return st;
}

int kvs_token_to_piece(const kvs_model *m, int32_t tok, int render_special, char *buf, int n) {
    const kvs_tokenizer *t = TOK(m);
    if (tok < 0 || tok >= t->n) return 0;
    const char *s = t->text + t->off[tok];
    uint32_t l = t->len[tok];
    int type = t->type[tok];
    if (type == TT_BYTE) {
        unsigned b;
        if (sscanf(s, "<0x%02X>", &b) == 1) {
            if (n >= 1) buf[0] = (char)b;
            return 1;
        }
    }
    if ((type == TT_CONTROL || type == TT_UNKNOWN || type == TT_UNUSED) && !render_special) return 0;
    if (type == TT_CONTROL || type == TT_USER) {
        if ((int)l <= n) memcpy(buf, s, l);
        return (int)l;
    }
    int w = 0;
    if (t->bpe) { /* mapped code points back to bytes */
        for (uint32_t i = 0; i < l;) {
            uint32_t cp;
            int cl = utf8_cp(s, l, i, &cp);
            int b = cp < 512 ? t->cp_byte[cp] : -1;
            if (b >= 0) {
                if (w < n) buf[w] = (char)b;
                w++;
            } else { /* not a mapped byte: copy as is */
                for (int k = 0; k < cl; k++, w++)
                    if (w < n) buf[w] = s[i + k];
            }
            i += (uint32_t)cl;
        }
        return w;
    }
    /* U+2581 -> space */
    for (uint32_t i = 0; i < l;) {
        if (i + 3 <= l && !memcmp(s + i, "\xe2\x96\x81", 3)) {
            if (w < n) buf[w] = ' ';
            w++;
            i += 3;
        } else {
            if (w < n) buf[w] = s[i];
            w++;
            i++;
        }
    }
    return w;
}

kvs_status kvs_detokenize(const kvs_model *m, const int32_t *toks, int n, int render_special, char **out,
                          kvs_err *err) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "detokenize: out of memory");
    for (int i = 0; i < n; i++) {
        if (toks[i] < 0 || toks[i] >= TOK(m)->n) {
            free(s);
            return kvs_errorf(err, KVS_ERR_INVALID, "detokenize: token %d at index %d is out of range [0, %d)",
                              toks[i], i, TOK(m)->n);
        }
        int w = kvs_token_to_piece(m, toks[i], render_special, NULL, 0);
        if (len + (size_t)w + 1 > cap) {
            while (len + (size_t)w + 1 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return kvs_errorf(err, KVS_ERR_NOMEM, "detokenize: out of memory");
            }
            s = ns;
        }
        kvs_token_to_piece(m, toks[i], render_special, s + len, w);
        len += (size_t)w;
    }
    s[len] = 0;
    *out = s;
    return KVS_OK;
}

/* ---- chat templates ------------------------------------------------------------ */

typedef struct {
    char *s;
    size_t n, cap;
    int ok;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t l = strlen(s);
    if (!b->ok) return;
    if (b->n + l + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + l + 1) c *= 2;
        char *ns = realloc(b->s, c);
        if (!ns) {
            b->ok = 0;
            return;
        }
        b->s = ns;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, l + 1);
    b->n += l;
}

kvs_status kvs_chat_apply(const kvs_model *m, const kvs_chat_msg *msgs, int n, int add_generation_prompt,
                          char **out, kvs_err *err) {
    *out = NULL;
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return kvs_errorf(err, KVS_ERR_INVALID, "messages[%d]: role and content are required", i);
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))
            return kvs_errorf(err, KVS_ERR_INVALID, "messages[%d].role: '%s' is not one of system, user, assistant",
                              i, msgs[i].role);
    }
    sbuf b = {NULL, 0, 0, 1};
    const char *bos = m->special.bos >= 0 ? kvs_token_text(m, m->special.bos) : "";
    switch (TOK(m)->family) {
    case FAM_GEMMA: {
        sb_add(&b, bos);
        const char *sys = NULL;
        for (int i = 0; i < n; i++) {
            if (!strcmp(msgs[i].role, "system")) {
                sys = msgs[i].content;
                continue;
            }
            int user = !strcmp(msgs[i].role, "user");
            sb_add(&b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (user && sys) {
                sb_add(&b, sys);
                sb_add(&b, "\n\n");
                sys = NULL;
            }
            sb_add(&b, msgs[i].content);
            sb_add(&b, "<end_of_turn>\n");
        }
        if (sys) { /* a system message with no user turn after it */
            sb_add(&b, "<start_of_turn>user\n");
            sb_add(&b, sys);
            sb_add(&b, "<end_of_turn>\n");
        }
        if (add_generation_prompt) sb_add(&b, "<start_of_turn>model\n");
        break;
    }
    case FAM_LLAMA3:
        sb_add(&b, bos);
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|start_header_id|>");
            sb_add(&b, msgs[i].role);
            sb_add(&b, "<|end_header_id|>\n\n");
            sb_add(&b, msgs[i].content);
            sb_add(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case FAM_CHATML:
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|im_start|>");
            sb_add(&b, msgs[i].role);
            sb_add(&b, "\n");
            sb_add(&b, msgs[i].content);
            sb_add(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
        break;
    default: { /* llama 2 */
        const char *sys = NULL;
        int open = 0;
        for (int i = 0; i < n; i++) {
            if (!strcmp(msgs[i].role, "system")) {
                sys = msgs[i].content;
                continue;
            }
            if (!strcmp(msgs[i].role, "user")) {
                sb_add(&b, bos);
                sb_add(&b, "[INST] ");
                if (sys) {
                    sb_add(&b, "<<SYS>>\n");
                    sb_add(&b, sys);
                    sb_add(&b, "\n<</SYS>>\n\n");
                    sys = NULL;
                }
                sb_add(&b, msgs[i].content);
                sb_add(&b, " [/INST]");
                open = 1;
            } else {
                sb_add(&b, " ");
                sb_add(&b, msgs[i].content);
                sb_add(&b, " ");
                sb_add(&b, m->special.eos >= 0 ? kvs_token_text(m, m->special.eos) : "");
                open = 0;
            }
        }
        (void)open;
        break;
    }
    }
    if (!b.ok || !b.s) {
        free(b.s);
        if (b.ok) {
            b.s = calloc(1, 1);
            if (b.s) {
                *out = b.s;
                return KVS_OK;
            }
        }
        return kvs_errorf(err, KVS_ERR_NOMEM, "chat template: out of memory");
    }
    *out = b.s;
    return KVS_OK;
}
