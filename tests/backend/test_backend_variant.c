/*
 * test_backend_variant.c -- a variant's session made from a shared prefill by
 * gathering its kept rows (kvs_session_compress_from, kvs_session_copy_plan:
 * what the server does per variant) against the path it replaces, a full
 * copy compacted in place (kvs_session_copy + kvs_session_compress_with, or
 * + kvs_session_compress for "full"), on tiny random-weight models: gemma3
 * (sliding-window layers, trimmed in the prefill or compressed too) and
 * llama; f16, K q8_0 with V q4_0, and kivi4 (G 8, R 16: the stores hold
 * quantised groups) caches; methods that gather (snapkv), keep per-head
 * counts (adakv, ragged), merge (lookm), zero key channels (think), read the
 * prefill's attention statistics (h2o), and full; query-agnostic (the suffix
 * extends the compressed cache: <= 64 tokens and a longer one through the
 * prefill kernels) and query-aware (the suffix joins the prompt before the
 * plan, kvs_session_extend_prompt, on a copy of the prefill; not with kivi4,
 * whose extension quantises the copy so that no method can plan on it).
 * Checked bit for bit: the stats (all but compress_ms), each layer's rows,
 * positions, lengths, per-head counts and flags (non-KIVI), the suffix's
 * logits and every greedy decode step's logits. The new session is sized
 * n_past + suffix + tokens + 1 and decodes them all; one more position past
 * its context is refused. Refusals: other cache types, a context shorter
 * than the source, a session copied onto itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_backend.h"
#include "kvsieve_methods.h"
#include "session_internal.h"
#include "test_util.h"
#include "tiny_model.h"

enum { N = 60, T = 24, NSUF = 6, NSUF_LONG = 70 };

static int n_ragged, n_merge, n_kchan;

/* The cache state of a and b is the same, byte for byte (sessions not yet sealed into KIVI stores). */
static void same_cache(const kvs_session *a, const kvs_session *b, const char *what) {
    const kvs_model_info *I = kvs_model_get_info(a->m);
    CHECK_MSG(a->n_past == b->n_past && a->n_prompt == b->n_prompt, "%s: n_past %d/%d n_prompt %d/%d", what,
              a->n_past, b->n_past, a->n_prompt, b->n_prompt);
    CHECK_MSG(!memcmp(a->modality, b->modality, (size_t)a->n_past), "%s: modality", what);
    for (int l = 0; l < I->n_layers; l++) {
        const kv_layer *x = &a->kv[l], *y = &b->kv[l];
        CHECK_MSG(x->len == y->len && x->compressed == y->compressed && x->bounded == y->bounded && !x->lag == !y->lag &&
                      !x->kivi == !y->kivi,
                  "%s: layer %d: len %d/%d compressed %d/%d bounded %d/%d", what, l, x->len, y->len, x->compressed,
                  y->compressed, x->bounded, y->bounded);
        if (x->len != y->len || !x->lag != !y->lag || x->kivi || y->kivi) continue;
        for (int g = 0; g < I->n_kv_heads; g++) {
            CHECK_MSG(kvs_kv_lag(x, g) == kvs_kv_lag(y, g), "%s: layer %d head %d: lag %d/%d", what, l, g,
                      kvs_kv_lag(x, g), kvs_kv_lag(y, g));
            const size_t rows = (size_t)(x->len - kvs_kv_lag(x, g));
            CHECK_MSG(!memcmp(kvs_kv_krow(a, x, g, 0), kvs_kv_krow(b, y, g, 0), rows * a->rsz_k) &&
                          !memcmp(kvs_kv_vrow(a, x, g, 0), kvs_kv_vrow(b, y, g, 0), rows * a->rsz_v) &&
                          !memcmp(kvs_kv_pos(x, g), kvs_kv_pos(y, g), rows * sizeof(int32_t)),
                      "%s: layer %d head %d: rows differ", what, l, g);
        }
    }
}

static void same_stats(kvs_kv_stats a, kvs_kv_stats b, const char *what) {
    a.compress_ms = b.compress_ms = 0;
    CHECK_MSG(!memcmp(&a, &b, sizeof a), "%s: kv stats differ (bytes after %lld / %lld, method %s / %s)", what,
              (long long)a.bytes_after_total, (long long)b.bytes_after_total, a.method, b.method);
}

static kvs_status new_session(kvs_model *m, int n_ctx, int record, int ctk, kvs_session **out, kvs_err *err) {
    const int kivi = ctk == KVS_CACHE_KIVI4;
    kvs_session_opts so = {n_ctx, 2, record, ctk, kivi ? 0 : ctk == KVS_CACHE_Q8_0 ? KVS_CACHE_V(KVS_CACHE_Q4_0) : 0};
    kvs_status st = kvs_session_new(m, &so, out, err);
    if (st == KVS_OK && kivi) st = kvs_session_set_kivi(*out, 8, 16, err);
    if (st == KVS_OK) kvs_session_set_attn_stats(*out, 1);
    return st;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* One variant both ways from src (a prefill, trimmed or not, or a query-aware branch), then the
 * query-agnostic suffix (nsuf tokens, 0: none) and T greedy steps on both. */
static void variant(kvs_model *m, int ctk, kvs_session *src, const char *method, int local, int nsuf,
                    const int32_t *suf, const char *what) {
    kvs_err err = {0};
    const kvs_model_info *I = kvs_model_get_info(m);
    const int V = I->n_vocab;
    kvs_session *old = NULL, *nw = NULL;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    int map[KVS_MAX_LAYERS];
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    const int reach = kvs_session_n_past(src) + nsuf + T + 1;
    CHECK_OK(new_session(m, 256, 0, ctk, &old, &err), &err);
    CHECK_OK(new_session(m, reach, 0, ctk, &nw, &err), &err);
    if (!old || !nw || !la || !lb) goto done;
    kvs_kv_stats sa, sb;
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = kvs_method_find(method);
    CHECK_MSG(co.method != NULL, "%s: method %s", what, method);
    if (!co.method) goto done;
    CHECK_OK(kvs_session_copy(old, src, &err), &err);
    if (!strcmp(method, "full")) {
        CHECK_OK(kvs_session_compress(old, &co, &sa, &err), &err);
        CHECK_OK(kvs_session_copy_plan(nw, src, NULL, NULL, NULL, &err), &err);
        CHECK_OK(kvs_session_compress(nw, &co, &sb, &err), &err);
    } else {
        kvs_params_defaults(co.method, &co.params);
        if (!strcmp(method, "adakv")) /* a window short of the budget: the heads compete for the rest */
            CHECK_OK(kvs_params_set(co.method, &co.params, "window", "4", &err), &err);
        co.compress_local = local;
        const kvs_budget b = {0.4, 0};
        CHECK_OK(kvs_session_plan_many(src, &co, &b, 1, &plan, map, NULL, &err), &err);
        if (plan.n_layers == 0) goto done;
        for (int pl = 0; pl < plan.n_layers; pl++) n_ragged += plan.layers[pl].counts != NULL;
        n_merge += plan.merge != KVS_MERGE_NONE;
        n_kchan += plan.kchan != NULL;
        { /* the gather alone against apply_plan on a copy (before the trim) */
            kvs_session *c = NULL, *g = NULL;
            kvs_kv_stats s1, s2;
            CHECK_OK(new_session(m, reach, 0, ctk, &c, &err), &err);
            CHECK_OK(new_session(m, reach, 0, ctk, &g, &err), &err);
            if (c && g) {
                CHECK_OK(kvs_session_copy(c, src, &err), &err);
                CHECK_OK(kvs_session_apply_plan(c, &plan, map, &s1, &err), &err);
                CHECK_OK(kvs_session_copy_plan(g, src, &plan, map, &s2, &err), &err);
                same_stats(s1, s2, what);
                same_cache(c, g, what);
            }
            kvs_session_free(c);
            kvs_session_free(g);
        }
        CHECK_OK(kvs_session_compress_with(old, &plan, map, &sa, &err), &err);
        CHECK_OK(kvs_session_compress_from(nw, src, &plan, map, &sb, &err), &err);
    }
    same_stats(sa, sb, what);
    if (ctk != KVS_CACHE_KIVI4) same_cache(old, nw, what);
    for (int l = 0; l < I->n_layers; l++) { /* room for what it will decode, not the server's context */
        const kv_layer *x = &old->kv[l], *y = &nw->kv[l];
        if (x->bounded || x->kivi) continue;
        CHECK_MSG(x->cap - x->len == 256 - src->n_past && y->cap - y->len == reach - src->n_past,
                  "%s: layer %d: room %d / %d", what, l, x->cap - x->len, y->cap - y->len);
    }
    if (nsuf > 0) {
        CHECK_OK(kvs_session_extend(old, suf, nsuf, la, &err), &err);
        CHECK_OK(kvs_session_extend(nw, suf, nsuf, lb, &err), &err);
        CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: the suffix's logits differ", what);
    } else {
        int32_t t0 = suf[0]; /* decode from a fixed token */
        CHECK_OK(kvs_session_decode(old, t0, la, &err), &err);
        CHECK_OK(kvs_session_decode(nw, t0, lb, &err), &err);
        CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: the first step's logits differ", what);
    }
    for (int t = 1; t < T; t++) {
        const int32_t tok = argmax(la, V);
        CHECK_OK(kvs_session_decode(old, tok, la, &err), &err);
        kvs_status st = kvs_session_decode(nw, tok, lb, &err);
        CHECK_MSG(st == KVS_OK, "%s: step %d: the variant's session cannot decode: %s", what, t, err.msg);
        if (st) break;
        CHECK_MSG(!memcmp(la, lb, (size_t)V * 4), "%s: step %d: logits differ", what, t);
    }
    if (ctk != KVS_CACHE_KIVI4) same_cache(old, nw, what); /* the sliding windows moved the same way */
    /* sized honestly: it decodes up to its reach (one spare position), then the context is full */
    while (kvs_session_n_past(nw) < reach) {
        kvs_status st = kvs_session_decode(nw, 1, lb, &err);
        CHECK_MSG(st == KVS_OK, "%s: decode at %d of %d: %s", what, kvs_session_n_past(nw), reach, err.msg);
        if (st) break;
    }
    CHECK_FAILS(kvs_session_decode(nw, 1, lb, &err), KVS_ERR_INVALID, &err, "context is full");
done:
    kvs_plan_free(&plan);
    kvs_session_free(old);
    kvs_session_free(nw);
    free(la);
    free(lb);
}

static const char *const METHODS[] = {"snapkv", "adakv", "lookm", "think", "h2o", "full"};
enum { N_METHODS = sizeof METHODS / sizeof METHODS[0] };

static void run(const char *arch, int ctk) {
    kvs_err err = {0};
    tiny_spec sp = tiny_default(arch);
    sp.head_dim = 32; /* whole Q8_0 / Q4_0 blocks */
    char path[96];
    snprintf(path, sizeof path, "backend_variant_%s_%d.gguf", arch, ctk);
    CHECK_OK(tiny_write(&sp, path, &err), &err);
    kvs_model *m = NULL;
    kvs_model_opts mo = {2};
    CHECK_OK(kvs_model_load(path, &mo, &m, &err), &err);
    if (!m) return;
    const int V = kvs_model_get_info(m)->n_vocab;
    int32_t toks[N], suf[NSUF_LONG];
    uint64_t rng = 11 + (uint64_t)ctk;
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    for (int i = 0; i < NSUF_LONG; i++) suf[i] = (int32_t)(kvs_rng_next(&rng) % (uint64_t)V);
    const int windows = sp.sliding_window > 0;
    kvs_session *pre = NULL, *trimmed = NULL, *branch = NULL;
    CHECK_OK(new_session(m, 256, -1, ctk, &pre, &err), &err);
    CHECK_OK(new_session(m, 256, -1, ctk, &trimmed, &err), &err);
    CHECK_OK(new_session(m, 256, -1, ctk, &branch, &err), &err);
    if (!pre || !trimmed || !branch) goto done;
    CHECK_OK(kvs_session_prefill(pre, toks, N, NULL, NULL, &err), &err);
    CHECK_MSG(kvs_session_has_attn_stats(pre), "%s: the prefill has attention statistics", arch);
    CHECK_OK(kvs_session_copy(trimmed, pre, &err), &err);
    CHECK_OK(kvs_session_trim_local(trimmed, &err), &err);
    CHECK_OK(kvs_session_copy(branch, pre, &err), &err);
    if (ctk != KVS_CACHE_KIVI4) CHECK_OK(kvs_session_extend_prompt(branch, suf, NSUF, NULL, &err), &err);
    for (int k = 0; k < N_METHODS; k++) {
        char what[160];
        const char *me = METHODS[k];
        const char *ct = kvs_cache_type_name(ctk);
        snprintf(what, sizeof what, "%s %s %s agnostic", arch, ct, me);
        variant(m, ctk, pre, me, 0, NSUF, suf, what);
        snprintf(what, sizeof what, "%s %s %s agnostic, trimmed prefill, long suffix", arch, ct, me);
        variant(m, ctk, trimmed, me, 0, NSUF_LONG, suf, what);
        if (ctk == KVS_CACHE_KIVI4) continue; /* the extension quantised the branch: no plan on it (the server's too) */
        snprintf(what, sizeof what, "%s %s %s aware", arch, ct, me);
        variant(m, ctk, branch, me, 0, 0, suf, what);
        if (windows && strcmp(me, "adakv") && strcmp(me, "full")) { /* the local layers planned too */
            snprintf(what, sizeof what, "%s %s %s compress_local aware", arch, ct, me);
            variant(m, ctk, branch, me, 1, 0, suf, what);
        }
    }
    /* refusals */
    kvs_session *o = NULL;
    const int other = ctk == KVS_CACHE_F16 ? KVS_CACHE_F32 : KVS_CACHE_F16;
    CHECK_OK(new_session(m, 256, 0, other, &o, &err), &err);
    if (o) CHECK_FAILS(kvs_session_copy_plan(o, pre, NULL, NULL, NULL, &err), KVS_ERR_INVALID, &err, "cache types");
    kvs_session_free(o);
    o = NULL;
    CHECK_OK(new_session(m, N - 1, 0, ctk, &o, &err), &err);
    if (o) CHECK_FAILS(kvs_session_copy_plan(o, pre, NULL, NULL, NULL, &err), KVS_ERR_INVALID, &err, "context");
    kvs_session_free(o);
    CHECK_FAILS(kvs_session_copy_plan(pre, pre, NULL, NULL, NULL, &err), KVS_ERR_INVALID, &err, "source");
done:
    kvs_session_free(pre);
    kvs_session_free(trimmed);
    kvs_session_free(branch);
    kvs_model_free(m);
    remove(path);
}

int main(void) {
    const int types[] = {KVS_CACHE_F16, KVS_CACHE_Q8_0, KVS_CACHE_KIVI4};
    for (int t = 0; t < 3; t++) {
        run("gemma3", types[t]);
        run("llama", types[t]);
    }
    CHECK_MSG(n_ragged > 0, "adakv kept per-head counts in some plan (%d)", n_ragged);
    CHECK_MSG(n_merge > 0, "lookm merged (%d)", n_merge);
    CHECK_MSG(n_kchan > 0, "think zeroed key channels (%d)", n_kchan);
    return kvs_test_finish("backend_variant");
}
