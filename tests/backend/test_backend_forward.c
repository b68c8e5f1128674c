/*
 * test_backend_forward.c -- the forward pass of tiny random-weight models
 * (gemma3, llama, qwen2; F32 / F16 / BF16, the default model's quantised mix
 * and SmolLM2's Q4_1) against the float64 reference forward of tiny_model.c:
 * batched prefill logits, token-by-token decode logits, sliding-window
 * masking, thread-count independence, external embeddings; load errors naming
 * what is wrong.
 *
 * Tolerances (max |ours - ref| / max(1, max |ref|)): fp32-type weights 2e-3
 * (fp32 arithmetic on the same dequantised weights); quantised weights: prefill
 * 2e-2 (8-bit activations in its output projection and, where the block-scale
 * route runs them, in every Q8_0 / Q5_0 / Q4_K / Q6_K matrix), decode 5e-2
 * (activations are quantised to 8 bits per block of 32 for the integer dot
 * products of every matrix, as ggml does).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "test_util.h"
#include "tiny_model.h"

static double max_rel(const float *a, const double *ref, int n) {
    double mx = 1, d = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (int i = 0; i < n; i++) d = fmax(d, fabs(a[i] - ref[i]));
    return d / mx;
}

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void check_model(const tiny_spec *sp, const char *label, int quantised) {
    kvs_err err = {0};
    char path[128];
    snprintf(path, sizeof path, "backend_forward_%s.gguf", label);
    CHECK_OK(tiny_write(sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    CHECK(!strcmp(I->arch, sp->arch));
    CHECK_EQ_INT(I->n_layers, sp->n_layers);
    CHECK_EQ_INT(I->n_local_layers, !strcmp(sp->arch, "gemma3") ? 5 : 0);
    int V = I->n_vocab;
    const int n = 13;
    int32_t toks[13];
    uint64_t rng = 99;
    for (int i = 0; i < n; i++) toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    float *lp = malloc((size_t)V * sizeof *lp), *ld = malloc((size_t)V * sizeof *ld),
          *l1 = malloc((size_t)V * sizeof *l1);
    double *ref = malloc((size_t)V * sizeof *ref), *ref1 = malloc((size_t)V * sizeof *ref1);
    kvs_session *s = NULL, *s1 = NULL;
    kvs_session_opts so = {64, 2, 0, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so, &s, &err), &err);
    if (!s || !lp || !ld || !ref || !l1 || !ref1) goto done;
    /* prefill of all n vs reference */
    CHECK_OK(ref_forward(m, toks, n, NULL, ref, &err), &err);
    CHECK_OK(kvs_session_prefill(s, toks, n, NULL, lp, &err), &err);
    double e = max_rel(lp, ref, V);
    CHECK_MSG(e <= (quantised ? 2e-2 : 2e-3), "%s: prefill logits differ from the float64 reference by %g", label, e);
    CHECK_EQ_INT(kvs_session_n_past(s), n);
    /* prefill n-1, decode the last */
    kvs_session_reset(s);
    CHECK_OK(kvs_session_prefill(s, toks, n - 1, NULL, NULL, &err), &err);
    CHECK_OK(kvs_session_decode(s, toks[n - 1], ld, &err), &err);
    e = max_rel(ld, ref, V);
    CHECK_MSG(e <= (quantised ? 5e-2 : 2e-3), "%s: decode logits differ from the reference by %g", label, e);
    if (!quantised) CHECK_EQ_INT(argmax_f(ld, V), argmax_f(lp, V));
    /* one token prefill + decodes all the way (window masking in decode) */
    kvs_session_reset(s);
    CHECK_OK(kvs_session_prefill(s, toks, 1, NULL, NULL, &err), &err);
    for (int i = 1; i < n; i++) CHECK_OK(kvs_session_decode(s, toks[i], ld, &err), &err);
    e = max_rel(ld, ref, V);
    CHECK_MSG(e <= (quantised ? 5e-2 : 2e-3), "%s: token-by-token logits differ from the reference by %g", label, e);
    /* a single thread gives the same logits (sgemm blocking may change the last bits) */
    kvs_session_opts so1 = {64, 1, 0, KVS_CACHE_F32, 0};
    CHECK_OK(kvs_session_new(m, &so1, &s1, &err), &err);
    if (s1) {
        CHECK_OK(kvs_session_prefill(s1, toks, n, NULL, l1, &err), &err);
        double d = 0, mx = 1;
        for (int i = 0; i < V; i++) {
            d = fmax(d, fabs(l1[i] - lp[i]));
            mx = fmax(mx, fabs(lp[i]));
        }
        CHECK_MSG(d <= 1e-5 * mx, "%s: 1 thread vs 2 threads differ by %g", label, d);
    }
    /* chunked prefill: chunks of 5 tokens see the earlier chunks through the cache */
    {
        kvs_session *sc = NULL;
        kvs_session_opts soc = {64, 2, 0, KVS_CACHE_F32, 0};
        CHECK_OK(kvs_session_new(m, &soc, &sc, &err), &err);
        static const int ubs[] = {1, 2, 3, 5, 12};
        for (int u = 0; sc && u < 5; u++) {
            kvs_session_reset(sc);
            kvs_session_set_ubatch(sc, ubs[u]);
            CHECK_OK(kvs_session_prefill(sc, toks, n, NULL, l1, &err), &err);
            e = max_rel(l1, ref, V);
            CHECK_MSG(e <= (quantised ? 2e-2 : 2e-3), "%s: prefill in chunks of %d differs from the reference by %g",
                      label, ubs[u], e);
        }
        kvs_session_free(sc);
    }
    /* a shorter prompt: reference of a prefix */
    CHECK_OK(ref_forward(m, toks, 3, NULL, ref1, &err), &err);
    kvs_session_reset(s);
    CHECK_OK(kvs_session_prefill(s, toks, 3, NULL, l1, &err), &err);
    e = max_rel(l1, ref1, V);
    /* (prompts of <= 8 tokens run through the decode kernels: decode tolerance) */
    CHECK_MSG(e <= (quantised ? 5e-2 : 2e-3), "%s: 3-token prefill differs from the reference by %g", label, e);
    /* errors */
    CHECK_FAILS(kvs_session_prefill(s, toks, 3, NULL, l1, &err), KVS_ERR_INVALID, &err, "not empty");
    kvs_session_reset(s);
    CHECK_FAILS(kvs_session_decode(s, toks[0], l1, &err), KVS_ERR_INVALID, &err, "prefill first");
    int32_t bad[2] = {0, V + 5};
    CHECK_FAILS(kvs_session_prefill(s, bad, 2, NULL, l1, &err), KVS_ERR_INVALID, &err, "index 1");
    int32_t *big = calloc(65, sizeof *big);
    if (big) CHECK_FAILS(kvs_session_prefill(s, big, 65, NULL, l1, &err), KVS_ERR_INVALID, &err, "more than the context");
    free(big);
done:
    free(lp);
    free(ld);
    free(l1);
    free(ref);
    free(ref1);
    kvs_session_free(s);
    kvs_session_free(s1);
    kvs_model_free(m);
    remove(path);
}

static void embeddings_input(void) {
    /* external embeddings equal to the scaled token embeddings give the same logits */
    kvs_err err = {0};
    tiny_spec sp = tiny_default("gemma3");
    const char *path = "backend_forward_embd.gguf";
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    CHECK_OK(kvs_model_load(path, NULL, &m, &err), &err);
    if (!m) return;
    const kvs_model_info *I = kvs_model_get_info(m);
    int E = I->n_embd, V = I->n_vocab, n = 5;
    int32_t toks[5] = {2, 270, 280, 290, 100};
    const kvs_gguf_tensor *te = kvs_gguf_find_tensor(kvs_model_gguf(m), "token_embd.weight");
    float *embd = malloc((size_t)n * E * sizeof *embd), *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    kvs_session *s = NULL;
    CHECK_OK(kvs_session_new(m, NULL, &s, &err), &err);
    if (te && embd && a && b && s) {
        for (int t = 0; t < n; t++) {
            kvs_dequant_row(te->type, (const uint8_t *)te->data + kvs_ggml_row_size(te->type, E) * (size_t)toks[t],
                            embd + (size_t)t * E, E, &err);
            for (int i = 0; i < E; i++) embd[(size_t)t * E + i] *= sqrtf((float)E);
        }
        uint8_t mod[5] = {0, 1, 1, 0, 0};
        CHECK_OK(kvs_session_prefill_embd(s, embd, n, mod, a, &err), &err);
        kvs_session_reset(s);
        CHECK_OK(kvs_session_prefill(s, toks, n, NULL, b, &err), &err);
        double d = 0;
        for (int i = 0; i < V; i++) d = fmax(d, fabs(a[i] - b[i]));
        CHECK_MSG(d <= 1e-4, "embedding input differs from token input by %g", d);
        kvs_session_reset(s);
        embd[3] = NAN;
        CHECK_FAILS(kvs_session_prefill_embd(s, embd, n, NULL, a, &err), KVS_ERR_NUMERIC, &err, "position 0");
        uint8_t badmod[5] = {0, 9, 0, 0, 0};
        CHECK_FAILS(kvs_session_prefill(s, toks, n, badmod, a, &err), KVS_ERR_INVALID, &err, "modality[1]");
    }
    free(embd);
    free(a);
    free(b);
    kvs_session_free(s);
    kvs_model_free(m);
    remove(path);
}

static void load_errors(void) {
    kvs_err err = {0};
    kvs_model *m = NULL;
    const char *path = "backend_forward_bad.gguf";
    kvs_gguf_writer *w = NULL;
    /* unsupported architecture */
    CHECK_OK(kvs_gguf_writer_new(&w, &err), &err);
    if (!w) return;
    kvs_gguf_writer_add_str(w, "general.architecture", "mamba", &err);
    CHECK_OK(kvs_gguf_writer_write(w, path, &err), &err);
    kvs_gguf_writer_free(w);
    CHECK_FAILS(kvs_model_load(path, NULL, &m, &err), KVS_ERR_UNSUPPORTED, &err, "architecture 'mamba'");
    /* gemma3 metadata but no tensors */
    CHECK_OK(kvs_gguf_writer_new(&w, &err), &err);
    if (!w) return;
    kvs_gguf_writer_add_str(w, "general.architecture", "gemma3", &err);
    kvs_gguf_writer_add_u32(w, "gemma3.block_count", 2, &err);
    kvs_gguf_writer_add_u32(w, "gemma3.embedding_length", 64, &err);
    kvs_gguf_writer_add_u32(w, "gemma3.feed_forward_length", 96, &err);
    kvs_gguf_writer_add_u32(w, "gemma3.attention.head_count", 4, &err);
    CHECK_OK(kvs_gguf_writer_write(w, path, &err), &err);
    kvs_gguf_writer_free(w);
    CHECK_FAILS(kvs_model_load(path, NULL, &m, &err), KVS_ERR_FORMAT, &err, "tensor 'token_embd.weight' is missing");
    /* missing hyper-parameter */
    CHECK_OK(kvs_gguf_writer_new(&w, &err), &err);
    if (!w) return;
    kvs_gguf_writer_add_str(w, "general.architecture", "llama", &err);
    CHECK_OK(kvs_gguf_writer_write(w, path, &err), &err);
    kvs_gguf_writer_free(w);
    CHECK_FAILS(kvs_model_load(path, NULL, &m, &err), KVS_ERR_FORMAT, &err, "llama.block_count");
    CHECK(m == NULL);
    remove(path);
    /* default model resolution with an explicit missing path */
    char out[256];
    CHECK_FAILS(kvs_model_resolve("/no/such/model.gguf", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "/no/such/model.gguf");
}

int main(void) {
    tiny_spec g = tiny_default("gemma3");
    check_model(&g, "gemma3_f32", 0);
    g.type_attn = KVS_GGML_F16;
    g.type_ffn = KVS_GGML_BF16;
    g.type_down = KVS_GGML_F16;
    g.type_embd = KVS_GGML_BF16;
    check_model(&g, "gemma3_f16", 0);
    /* the default model's mix: Q5_0 / Q8_0 attention, Q4_K gate/up, Q6_K down, Q8_0 embeddings;
     * K-quants need rows of 256 */
    tiny_spec q = tiny_default("gemma3");
    q.n_embd = 256;
    q.n_ff = 512;
    q.n_heads = 2;
    q.n_kv_heads = 1;
    q.head_dim = 128;
    q.type_attn = KVS_GGML_Q5_0;
    q.type_ffn = KVS_GGML_Q4_K;
    q.type_down = KVS_GGML_Q6_K;
    q.type_embd = KVS_GGML_Q8_0;
    check_model(&q, "gemma3_quant", 1);
    q.type_attn = KVS_GGML_Q8_0;
    check_model(&q, "gemma3_quant8", 1);
    /* query width 8 x 128 = 1024 above n_ff 512: the output projection's input is prefill's widest */
    q.n_heads = 8;
    q.n_kv_heads = 2;
    check_model(&q, "gemma3_quant_wide", 1);
    tiny_spec l = tiny_default("llama");
    check_model(&l, "llama_f32", 0);
    /* SmolLM2-135M's mix: Q4_1 matrices, Q8_0 embeddings (n_ff 96 = 3 blocks of 32) */
    l.type_attn = l.type_ffn = l.type_down = KVS_GGML_Q4_1;
    l.type_embd = KVS_GGML_Q8_0;
    check_model(&l, "llama_q4_1", 1);
    l = tiny_default("llama");
    l.rope_linear = 2.0f;
    l.rope_freqs = 1;
    check_model(&l, "llama_rope_scaled", 0);
    g = tiny_default("gemma3");
    g.rope_linear = 8.0f;
    check_model(&g, "gemma3_rope_linear", 0);
    tiny_spec w = tiny_default("qwen2");
    check_model(&w, "qwen2_f32", 0);
    w.bpe = 1;
    check_model(&w, "qwen2_bpe", 0);
    embeddings_input();
    load_errors();
    return kvs_test_finish("backend_forward");
}
