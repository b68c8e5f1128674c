/*
 * tiny_model.c -- tiny GGUF models for the engine tests and a float64
 * reference forward pass (see tiny_model.h). The reference is written from
 * the architectures' definitions, not from backend/model/session.c: plain loops,
 * doubles, exact tanh/exp, full causal attention with the sliding-window mask.
 */
#include "tiny_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tiny_spec tiny_default(const char *arch) {
    tiny_spec s;
    memset(&s, 0, sizeof s);
    s.arch = arch;
    s.n_layers = 6;
    s.n_embd = 64;
    s.n_ff = 96;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 16;
    s.sliding_window = !strcmp(arch, "gemma3") ? 4 : 0;
    s.n_ctx = 256;
    s.type_attn = s.type_ffn = s.type_down = s.type_embd = KVS_GGML_F32;
    s.seed = 1234;
    return s;
}

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece space */
static const char *PIECES[] = {SP, SP "the", SP "a", "he", "th", "the", "an", SP "an",
                               "d", "e", "h", "t", "a", "n", "o", "s", "r", "l", SP "is", "is", "i", "c",
                               SP "cat", "at", "ca", SP "s", SP "c", SP "t",
                               SP "o", "on", SP "on", "\n", "  "};
#define N_PIECES ((int)(sizeof PIECES / sizeof PIECES[0]))

/* "Ġ" is U+0120, the GPT-2 symbol of the space byte */
const char *const TINY_MERGES[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "o r", "\xc4\xa0w or",
                                   "\xc4\xa0wor l", "\xc4\xa0worl d"};
const int TINY_N_MERGES = (int)(sizeof TINY_MERGES / sizeof TINY_MERGES[0]);

/* GPT-2 byte -> code point -> UTF-8 */
static void byte_symbol(int b, char out[4]) {
    int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF), extra = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) extra++;
    int cp = keep ? b : 256 + extra;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static kvs_status add_mat(kvs_gguf_writer *w, const char *name, int type, int64_t cols, int64_t rows, double scale,
                          double offset, uint64_t *rng, kvs_err *err) {
    size_t rb = kvs_ggml_row_size(type, cols);
    uint8_t *buf = malloc(rb * (size_t)rows);
    float *row = malloc((size_t)cols * sizeof *row);
    kvs_status st = KVS_OK;
    if (!buf || !row) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tiny model: out of memory");
        goto cleanup;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = (float)(offset + scale * kvs_rng_normal(rng));
        if ((st = kvs_quant_row(type, row, buf + rb * (size_t)r, cols, err))) goto cleanup;
    }
    int64_t ne[2] = {cols, rows};
    st = kvs_gguf_writer_add_tensor(w, name, type, rows > 1 ? 2 : 1, ne, buf, err);
cleanup:
    free(buf);
    free(row);
    return st;
}

kvs_status tiny_write(const tiny_spec *s, const char *path, kvs_err *err) {
    kvs_gguf_writer *w = NULL;
    kvs_status st = kvs_gguf_writer_new(&w, err);
    if (st) return st;
    char key[128];
    const char *A = s->arch;
    int gemma = !strcmp(A, "gemma3"), qwen = !strcmp(A, "qwen2");
    /* vocabulary */
    int nv = s->bpe ? 3 + 256 + TINY_N_MERGES : 6 + 256 + N_PIECES;
    const char **toks = malloc((size_t)nv * sizeof *toks);
    char(*bytes)[8] = malloc(256 * sizeof *bytes);
    float *scores = malloc((size_t)nv * sizeof *scores);
    int32_t *types = malloc((size_t)nv * sizeof *types);
    uint64_t rng = s->seed;
    char(*merged)[16] = NULL;
    if (!toks || !bytes || !scores || !types) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "tiny model: out of memory");
        goto cleanup;
    }
    if (s->bpe) {
        static const char *BS[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
        merged = malloc((size_t)TINY_N_MERGES * sizeof *merged);
        if (!merged) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "tiny model: out of memory");
            goto cleanup;
        }
        for (int i = 0; i < 3; i++) {
            toks[i] = BS[i];
            scores[i] = 0;
            types[i] = 3;
        }
        for (int b = 0; b < 256; b++) {
            byte_symbol(b, bytes[b]);
            toks[3 + b] = bytes[b];
            scores[3 + b] = 0;
            types[3 + b] = 1;
        }
        for (int i = 0; i < TINY_N_MERGES; i++) {
            const char *sp = strchr(TINY_MERGES[i], ' ');
            snprintf(merged[i], sizeof merged[i], "%.*s%s", (int)(sp - TINY_MERGES[i]), TINY_MERGES[i], sp + 1);
            toks[259 + i] = merged[i];
            scores[259 + i] = 0;
            types[259 + i] = 1;
        }
        goto vocab_done;
    }
    static const char *SPECIAL[6] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    for (int i = 0; i < 6; i++) {
        toks[i] = SPECIAL[i];
        scores[i] = 0;
        types[i] = i == 3 ? 2 : 3;
    }
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], 8, "<0x%02X>", b);
        toks[6 + b] = bytes[b];
        scores[6 + b] = 0;
        types[6 + b] = 6;
    }
    for (int i = 0; i < N_PIECES; i++) {
        toks[262 + i] = PIECES[i];
        /* longer pieces score higher so merges prefer them */
        scores[262 + i] = (float)strlen(PIECES[i]) - 0.01f * i;
        types[262 + i] = !strcmp(PIECES[i], "  ") ? 4 : 1;
    }
vocab_done:
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", A, k), key)
    if ((st = kvs_gguf_writer_add_str(w, "general.architecture", A, err)) ||
        (st = kvs_gguf_writer_add_str(w, "general.name", "tiny test model", err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)s->n_layers, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)s->n_ctx, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)s->n_heads, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_kv_heads, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim, err)) ||
        (st = kvs_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)s->head_dim, err)) ||
        (st = kvs_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f, err)) ||
        (st = kvs_gguf_writer_add_f32(w, KEY("rope.freq_base"), gemma ? 1e6f : 10000.0f, err)))
        goto cleanup;
    if (gemma && (st = kvs_gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)s->sliding_window, err)))
        goto cleanup;
    if (s->rope_linear > 0 && ((st = kvs_gguf_writer_add_str(w, KEY("rope.scaling.type"), "linear", err)) ||
                               (st = kvs_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), s->rope_linear, err))))
        goto cleanup;
    if (s->bpe && ((st = kvs_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", err)) ||
                   (st = kvs_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2", err)) ||
                   (st = kvs_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", TINY_MERGES, TINY_N_MERGES, err)) ||
                   (st = kvs_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, nv, err)) ||
                   (st = kvs_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, nv, err)) ||
                   (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2, err)) ||
                   (st = kvs_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0, err))))
        goto cleanup;
    if (!s->bpe && ((st = kvs_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", err)) ||
        (st = kvs_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, nv, err)) ||
        (st = kvs_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, nv, err)) ||
        (st = kvs_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, nv, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 2, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 1, err)) ||
        (st = kvs_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 3, err)) ||
        (st = kvs_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, err)) ||
        (st = kvs_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0, err))))
        goto cleanup;
#undef KEY
    const int E = s->n_embd, F = s->n_ff, QD = s->n_heads * s->head_dim, KD = s->n_kv_heads * s->head_dim;
    const double ws = 1.0 / sqrt((double)E);
    /* norms near 1 (gemma's GGUF stores 1 + w) */
    if ((st = add_mat(w, "token_embd.weight", s->type_embd, E, nv, gemma ? 0.05 : 0.5, 0, &rng, err)) ||
        (st = add_mat(w, "output_norm.weight", KVS_GGML_F32, E, 1, 0.1, 1.0, &rng, err)))
        goto cleanup;
    if (!gemma && (st = add_mat(w, "output.weight", s->type_embd, E, nv, 0.5, 0, &rng, err))) goto cleanup;
    if (s->rope_freqs && (st = add_mat(w, "rope_freqs.weight", KVS_GGML_F32, s->head_dim / 2, 1, 1.0, 4.0, &rng, err)))
        goto cleanup;
    for (int l = 0; l < s->n_layers; l++) {
        char n[96];
#define NAME(x) (snprintf(n, sizeof n, "blk.%d.%s", l, x), n)
        if ((st = add_mat(w, NAME("attn_norm.weight"), KVS_GGML_F32, E, 1, 0.1, 1.0, &rng, err)) ||
            (st = add_mat(w, NAME("attn_q.weight"), s->type_attn, E, QD, ws, 0, &rng, err)) ||
            (st = add_mat(w, NAME("attn_k.weight"), s->type_attn, E, KD, ws, 0, &rng, err)) ||
            (st = add_mat(w, NAME("attn_v.weight"), s->type_attn, E, KD, ws, 0, &rng, err)) ||
            (st = add_mat(w, NAME("attn_output.weight"), s->type_attn, QD, E, 1.0 / sqrt((double)QD), 0, &rng, err)) ||
            (st = add_mat(w, NAME("ffn_norm.weight"), KVS_GGML_F32, E, 1, 0.1, 1.0, &rng, err)) ||
            (st = add_mat(w, NAME("ffn_gate.weight"), s->type_ffn, E, F, ws, 0, &rng, err)) ||
            (st = add_mat(w, NAME("ffn_up.weight"), s->type_ffn, E, F, ws, 0, &rng, err)) ||
            (st = add_mat(w, NAME("ffn_down.weight"), s->type_down, F, E, 1.0 / sqrt((double)F), 0, &rng, err)))
            goto cleanup;
        if (gemma &&
            ((st = add_mat(w, NAME("attn_q_norm.weight"), KVS_GGML_F32, s->head_dim, 1, 0.1, 1.0, &rng, err)) ||
             (st = add_mat(w, NAME("attn_k_norm.weight"), KVS_GGML_F32, s->head_dim, 1, 0.1, 1.0, &rng, err)) ||
             (st = add_mat(w, NAME("post_attention_norm.weight"), KVS_GGML_F32, E, 1, 0.1, 1.0, &rng, err)) ||
             (st = add_mat(w, NAME("post_ffw_norm.weight"), KVS_GGML_F32, E, 1, 0.1, 1.0, &rng, err))))
            goto cleanup;
        if (qwen && ((st = add_mat(w, NAME("attn_q.bias"), KVS_GGML_F32, QD, 1, 0.2, 0, &rng, err)) ||
                     (st = add_mat(w, NAME("attn_k.bias"), KVS_GGML_F32, KD, 1, 0.2, 0, &rng, err)) ||
                     (st = add_mat(w, NAME("attn_v.bias"), KVS_GGML_F32, KD, 1, 0.2, 0, &rng, err))))
            goto cleanup;
#undef NAME
    }
    st = kvs_gguf_writer_write(w, path, err);
cleanup:
    free(merged);
    free(toks);
    free(bytes);
    free(scores);
    free(types);
    kvs_gguf_writer_free(w);
    return st;
}

/* ---- float64 reference forward ---------------------------------------------------- */

/* Tensor `name` as doubles [rows][cols]; NULL if absent. */
static double *tensor_d(const kvs_gguf *g, const char *name, int64_t *rows, int64_t *cols) {
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, name);
    if (!t) return NULL;
    int64_t R = t->n_dims > 1 ? t->ne[1] : 1, C = t->ne[0];
    double *d = malloc((size_t)(R * C) * sizeof *d);
    float *row = malloc((size_t)C * sizeof *row);
    if (!d || !row) {
        free(d);
        free(row);
        return NULL;
    }
    size_t rb = kvs_ggml_row_size(t->type, C);
    for (int64_t r = 0; r < R; r++) {
        if (kvs_dequant_row(t->type, (const uint8_t *)t->data + rb * (size_t)r, row, C, NULL) != KVS_OK) {
            free(d);
            free(row);
            return NULL;
        }
        for (int64_t c = 0; c < C; c++) d[r * C + c] = row[c];
    }
    free(row);
    if (rows) *rows = R;
    if (cols) *cols = C;
    return d;
}

static void ref_rmsnorm(double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}

/* y[rows] = W[rows][cols] x (+ b) */
static void ref_mv(const double *W, const double *b, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int c = 0; c < cols; c++) s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* theta_i = pos * scale * base^(-2i/D) / ff[i] */
static void ref_rope(double *v, int D, int pos, double base, int neox, double scale, const double *ff) {
    for (int i = 0; i < D / 2; i++) {
        double th = pos * scale * pow(base, -2.0 * i / D) / (ff ? ff[i] : 1.0), c = cos(th), s = sin(th);
        int a = neox ? i : 2 * i, b = neox ? i + D / 2 : 2 * i + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static int64_t meta_i(const kvs_gguf *g, const char *arch, const char *k, int64_t def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, k);
    int64_t v;
    return kvs_gguf_get_i64(g, key, &v, NULL) == KVS_OK ? v : def;
}
static double meta_f(const kvs_gguf *g, const char *arch, const char *k, double def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, k);
    double v;
    return kvs_gguf_get_f64(g, key, &v, NULL) == KVS_OK ? v : def;
}

kvs_status ref_forward(const kvs_model *m, const int32_t *toks, int n, const uint8_t *keep, double *logits,
                       kvs_err *err) {
    const kvs_gguf *g = kvs_model_gguf(m);
    char arch[32];
    kvs_status st = kvs_gguf_get_str(g, "general.architecture", arch, sizeof arch, err);
    if (st) return st;
    const int gemma = !strcmp(arch, "gemma3"), llama = !strcmp(arch, "llama");
    const int L = (int)meta_i(g, arch, "block_count", 0), E = (int)meta_i(g, arch, "embedding_length", 0);
    const int Hq = (int)meta_i(g, arch, "attention.head_count", 0);
    const int Hkv = (int)meta_i(g, arch, "attention.head_count_kv", Hq);
    const int D = (int)meta_i(g, arch, "attention.key_length", E / Hq);
    const int F = (int)meta_i(g, arch, "feed_forward_length", 0);
    const int W = gemma ? (int)meta_i(g, arch, "attention.sliding_window", 0) : 0;
    const double eps = meta_f(g, arch, "attention.layer_norm_rms_epsilon", 1e-6);
    const double base_g = meta_f(g, arch, "rope.freq_base", gemma ? 1e6 : 1e4), base_l = gemma ? 1e4 : base_g;
    const kvs_gguf_tensor *te = kvs_gguf_find_tensor(g, "token_embd.weight");
    const kvs_gguf_tensor *tout = kvs_gguf_find_tensor(g, "output.weight");
    if (!tout) tout = te; /* tied */
    float *frow = malloc((size_t)E * sizeof *frow); /* one dequantised row (token_embd may be huge) */
    int64_t V = te ? te->ne[1] : 0;
    double *onorm = tensor_d(g, "output_norm.weight", NULL, NULL);
    double *ff = tensor_d(g, "rope_freqs.weight", NULL, NULL); /* NULL when absent */
    double rscale = 1.0;
    {
        char key[128], ty[32];
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        if (kvs_gguf_get_str(g, key, ty, sizeof ty, NULL) == KVS_OK && !strcmp(ty, "linear"))
            rscale = 1.0 / meta_f(g, arch, "rope.scaling.factor", 1.0);
    }
    double *X = calloc((size_t)n * E, sizeof *X);            /* [n][E] */
    double *Kc = calloc((size_t)L * n * Hkv * D, sizeof *Kc); /* [L][n][Hkv*D] */
    double *Vc = calloc((size_t)L * n * Hkv * D, sizeof *Vc);
    double *xn = malloc((size_t)(E > F ? E : F) * sizeof *xn), *q = malloc((size_t)Hq * D * sizeof *q);
    double *att = malloc((size_t)Hq * D * sizeof *att), *o = malloc((size_t)E * sizeof *o);
    double *gg = malloc((size_t)F * sizeof *gg), *uu = malloc((size_t)F * sizeof *uu);
    double *sc = malloc((size_t)n * sizeof *sc);
    if (!te || !frow || !onorm || !X || !Kc || !Vc || !xn || !q || !att || !o || !gg || !uu || !sc) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "reference: out of memory or missing tensor");
        goto cleanup;
    }
    for (int t = 0; t < n; t++) {
        if ((st = kvs_dequant_row(te->type, (const uint8_t *)te->data + kvs_ggml_row_size(te->type, E) * (size_t)toks[t],
                                  frow, E, err)))
            goto cleanup;
        for (int i = 0; i < E; i++) X[(size_t)t * E + i] = frow[i] * (gemma ? sqrt((double)E) : 1.0);
    }
    for (int l = 0; l < L; l++) {
        char nm[96];
#define T(x) (snprintf(nm, sizeof nm, "blk.%d.%s", l, x), tensor_d(g, nm, NULL, NULL))
        double *an = T("attn_norm.weight"), *wq = T("attn_q.weight"), *wk = T("attn_k.weight"),
               *wv = T("attn_v.weight"), *wo = T("attn_output.weight"), *fn = T("ffn_norm.weight"),
               *wg = T("ffn_gate.weight"), *wu = T("ffn_up.weight"), *wd = T("ffn_down.weight");
        double *qn = T("attn_q_norm.weight"), *kn = T("attn_k_norm.weight"), *pan = T("post_attention_norm.weight"),
               *pfn = T("post_ffw_norm.weight"), *bq = T("attn_q.bias"), *bk = T("attn_k.bias"), *bv = T("attn_v.bias");
#undef T
        int local = gemma && W > 0 && (l + 1) % 6 != 0;
        double base = local ? base_l : base_g;
        double *K = Kc + (size_t)l * n * Hkv * D, *Vv = Vc + (size_t)l * n * Hkv * D;
        /* all positions' K, V first, then attention per position (causal) */
        double *Qall = malloc((size_t)n * Hq * D * sizeof *Qall);
        if (!Qall) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "reference: out of memory");
            goto layer_done;
        }
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < E; i++) xn[i] = X[(size_t)t * E + i];
            ref_rmsnorm(xn, an, E, eps);
            ref_mv(wq, bq, xn, Hq * D, E, Qall + (size_t)t * Hq * D);
            ref_mv(wk, bk, xn, Hkv * D, E, K + (size_t)t * Hkv * D);
            ref_mv(wv, bv, xn, Hkv * D, E, Vv + (size_t)t * Hkv * D);
            for (int h = 0; h < Hq; h++) {
                double *qh = Qall + ((size_t)t * Hq + h) * D;
                if (qn) ref_rmsnorm(qh, qn, D, eps);
                ref_rope(qh, D, t, base, !llama, local ? 1.0 : rscale, local ? NULL : ff);
            }
            for (int h = 0; h < Hkv; h++) {
                double *kh = K + ((size_t)t * Hkv + h) * D;
                if (kn) ref_rmsnorm(kh, kn, D, eps);
                ref_rope(kh, D, t, base, !llama, local ? 1.0 : rscale, local ? NULL : ff);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < Hq; h++) {
                int kh = h / (Hq / Hkv);
                const double *qh = Qall + ((size_t)t * Hq + h) * D;
                int j0 = local && t - W + 1 > 0 ? t - W + 1 : 0;
                double mx = -INFINITY;
                const uint8_t *kp = keep && t == n - 1 ? keep + ((size_t)l * Hkv + kh) * n : NULL;
                for (int j = j0; j <= t; j++) {
                    if (kp && j < t && !kp[j]) {
                        sc[j] = -INFINITY;
                        continue;
                    }
                    double s = 0;
                    for (int d = 0; d < D; d++) s += qh[d] * K[((size_t)j * Hkv + kh) * D + d];
                    sc[j] = s / sqrt((double)D);
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0;
                for (int j = j0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < D; d++) {
                    double a = 0;
                    for (int j = j0; j <= t; j++) a += sc[j] * Vv[((size_t)j * Hkv + kh) * D + d];
                    att[h * D + d] = a / sum;
                }
            }
            ref_mv(wo, NULL, att, E, Hq * D, o);
            if (pan) ref_rmsnorm(o, pan, E, eps);
            double *x = X + (size_t)t * E;
            for (int i = 0; i < E; i++) x[i] += o[i];
            for (int i = 0; i < E; i++) xn[i] = x[i];
            ref_rmsnorm(xn, fn, E, eps);
            ref_mv(wg, NULL, xn, F, E, gg);
            ref_mv(wu, NULL, xn, F, E, uu);
            for (int i = 0; i < F; i++) {
                double a = gg[i];
                double act = gemma ? 0.5 * a * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (a + 0.044715 * a * a * a)))
                                   : a / (1.0 + exp(-a));
                gg[i] = act * uu[i];
            }
            ref_mv(wd, NULL, gg, E, F, o);
            if (pfn) ref_rmsnorm(o, pfn, E, eps);
            for (int i = 0; i < E; i++) x[i] += o[i];
        }
    layer_done:
        free(Qall);
        free(an); free(wq); free(wk); free(wv); free(wo); free(fn); free(wg); free(wu); free(wd);
        free(qn); free(kn); free(pan); free(pfn); free(bq); free(bk); free(bv);
        if (st) goto cleanup;
    }
    for (int i = 0; i < E; i++) xn[i] = X[(size_t)(n - 1) * E + i];
    ref_rmsnorm(xn, onorm, E, eps);
    for (int64_t r = 0; r < V; r++) {
        if ((st = kvs_dequant_row(tout->type, (const uint8_t *)tout->data + kvs_ggml_row_size(tout->type, E) * (size_t)r,
                                  frow, E, err)))
            goto cleanup;
        double s = 0;
        for (int i = 0; i < E; i++) s += frow[i] * xn[i];
        logits[r] = s;
    }
cleanup:
    free(frow); free(onorm); free(ff); free(X); free(Kc); free(Vc); free(xn); free(q);
    free(att); free(o); free(gg); free(uu); free(sc);
    return st;
}
