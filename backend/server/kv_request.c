/*
 * kv_request.c -- the kv_compression field of a request: parsed and checked
 * into variant_req's (method, parameters, budget, compress_local, name,
 * suffix, chunk), or the server's default when the request has none.
 *
 * What it is: what the generation endpoints (server_gen.c), the scoring path
 * (logprobs.c) and the default's check at start (server.c) share. Every
 * refusal names the JSON field.
 * What it is not: running a compression (sched.c, chunked.c).
 */
#include "kvs_parts.h"
#include "kvsieve_methods.h"
#include "server_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_variants_free(gen_req *g) {
    for (int i = 0; g->variants && i < g->n_variants; i++) {
        free(g->variants[i].suffix);
        free(g->variants[i].suffix_text);
        kvs_composed_free(g->variants[i].owned);
    }
    free(g->variants);
    g->variants = NULL;
    g->n_variants = 0;
}

static int tokenize_suffix(const kvs_server *s, const char *text, const char *field, int32_t **out, int *n_out,
                           srv_error *e) {
    kvs_err err = {0};
    if (kvs_tokenize(s->model, text, strlen(text), 0, 1, out, n_out, &err) != KVS_OK)
        return srv_fail_kvs(e, &err, field);
    return 0;
}

static int parse_variant(const kvs_server *s, const cJSON *o, const char *field, variant_req *v,
                         srv_error *e) {
    snprintf(v->field, sizeof v->field, "%s", field);
    if (!cJSON_IsObject(o)) return srv_fail(e, 400, field, "%s must be an object {method, ratio | tokens, params}", field);
    static const char *const known[] = {"method", "ratio", "tokens", "params", "compress_local", "name",
                                        "suffix", "compress_suffix", "chunk", NULL};
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        int ok = 0;
        for (int k = 0; known[k]; k++) ok |= strcmp(it->string, known[k]) == 0;
        if (!ok) {
            char f[160];
            snprintf(f, sizeof f, "%s.%s", field, it->string);
            return srv_fail(e, 400, f, "%s: unknown field (known: method, ratio, tokens, params, "
                            "compress_local, name, suffix, compress_suffix, chunk)", f);
        }
    }
    char f[160];
    const char *name = srv_get_string(o, "name", field, "", e);
    if (!name) return -1;
    snprintf(v->name, sizeof v->name, "%s", name);
    char mmsg[400];
    snprintf(f, sizeof f, "%s.method", field);
    if (srv_parse_method(o, field, v, mmsg, sizeof mmsg)) /* a name or a composition */
        return srv_fail(e, 400, f, "%s", mmsg);
    kvs_err err = {0};
    kvs_params_defaults(v->method, &v->params);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    if (params && !cJSON_IsNull(params)) {
        snprintf(f, sizeof f, "%s.params", field);
        if (!cJSON_IsObject(params)) return srv_fail(e, 400, f, "%s must be an object {name: value}", f);
        cJSON_ArrayForEach(it, params) {
            char pf[224], txt[128];
            snprintf(pf, sizeof pf, "%s.params.%s", field, it->string);
            if (kvs_json_param_text(it, txt, sizeof txt))
                return srv_fail(e, 400, pf, "%s must be a number, a boolean or a string", pf);
            kvs_err_clear(&err);
            if (kvs_params_set(v->method, &v->params, it->string, txt, &err) != KVS_OK)
                return srv_fail(e, 400, pf, "%s: %s", pf, err.msg);
        }
    }
    const cJSON *ratio = cJSON_GetObjectItemCaseSensitive(o, "ratio");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    int has_r = ratio && !cJSON_IsNull(ratio), has_t = tokens && !cJSON_IsNull(tokens);
    if (has_r && has_t) {
        snprintf(f, sizeof f, "%s.ratio", field);
        return srv_fail(e, 400, f, "%s: give ratio or tokens, not both", field);
    }
    if (has_r) {
        snprintf(f, sizeof f, "%s.ratio", field);
        if (!cJSON_IsNumber(ratio) || !isfinite(ratio->valuedouble))
            return srv_fail(e, 400, f, "%s must be a number in (0, 1]", f);
        if (!(ratio->valuedouble > 0.0 && ratio->valuedouble <= 1.0))
            return srv_fail(e, 400, f, "%s must be in (0, 1], got %.17g", f, ratio->valuedouble);
        v->budget.ratio = ratio->valuedouble;
    } else if (has_t) {
        long long t;
        if (srv_get_int(o, "tokens", field, 0, 1, 1LL << 40, &t, e)) return -1;
        v->budget.tokens = t;
    } else if (strcmp(v->method->name, "full") == 0) {
        v->budget.ratio = 1.0;
    } else {
        snprintf(f, sizeof f, "%s.ratio", field);
        return srv_fail(e, 400, f, "%s: a budget is required: ratio in (0, 1] or tokens >= 1", field);
    }
    if (srv_get_bool(o, "compress_local", field, 0, &v->compress_local, e)) return -1;
    long long chunk;
    if (srv_get_int(o, "chunk", field, 0, 1, 1LL << 30, &chunk, e)) return -1;
    v->chunk = (int)chunk;
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(o, "suffix");
    if (sfx && !cJSON_IsNull(sfx)) {
        snprintf(f, sizeof f, "%s.suffix", field);
        if (!cJSON_IsString(sfx)) return srv_fail(e, 400, f, "%s must be a string", f);
        if (sfx->valuestring[0] && tokenize_suffix(s, sfx->valuestring, f, &v->suffix, &v->n_suffix, e))
            return -1;
        if (!(v->suffix_text = strdup(sfx->valuestring))) return srv_fail(e, 500, "", "out of memory");
    }
    if (srv_get_bool(o, "compress_suffix", field, 0, &v->compress_suffix, e)) return -1;
    if (v->compress_suffix && v->chunk) {
        snprintf(f, sizeof f, "%s.compress_suffix", field);
        return srv_fail(e, 400, f, "%s: not with chunk (the chunked prefill compresses the prompt alone)", f);
    }
    return 0;
}

int srv_join_suffixes(const kvs_server *s, const char *text, gen_req *g, srv_error *e) {
    for (int i = 0; i < g->n_variants; i++) {
        variant_req *v = &g->variants[i];
        if (!v->compress_suffix || v->n_suffix == 0) continue;
        v->suffix_apart = 1;
        if (!text) continue; /* token ids: nothing to join */
        size_t a = strlen(text), b = strlen(v->suffix_text);
        char *both = malloc(a + b + 1);
        if (!both) return srv_fail(e, 500, "", "out of memory");
        memcpy(both, text, a);
        memcpy(both + a, v->suffix_text, b + 1);
        int32_t *t = NULL;
        int n = 0;
        kvs_err err = {0};
        kvs_status st = kvs_tokenize(s->model, both, a + b, kvs_model_special(s->model)->add_bos, 1, &t, &n, &err);
        free(both);
        if (st != KVS_OK) {
            char f[96];
            snprintf(f, sizeof f, "%s.suffix", v->field);
            return srv_fail_kvs(e, &err, f);
        }
        if (n > g->n_prompt && !memcmp(t, g->prompt, (size_t)g->n_prompt * sizeof *t)) {
            memmove(t, t + g->n_prompt, (size_t)(n - g->n_prompt) * sizeof *t);
            free(v->suffix);
            v->suffix = t;
            v->n_suffix = n - g->n_prompt;
            v->suffix_apart = 0;
        } else {
            free(t);
        }
    }
    return 0;
}

const cJSON *srv_kv_compression(const kvs_server *s, const cJSON *root) {
    const cJSON *kc = cJSON_GetObjectItemCaseSensitive(root, "kv_compression");
    return kc && !cJSON_IsNull(kc) ? kc : s->default_kc;
}

int srv_parse_kv_compression(const kvs_server *s, const cJSON *kc, gen_req *g, srv_error *e) {
    if (!kc || cJSON_IsNull(kc)) return 0;
    const cJSON *list = NULL;
    const char *base = "kv_compression";
    if (cJSON_IsArray(kc)) {
        list = kc;
    } else if (cJSON_IsObject(kc)) {
        list = cJSON_GetObjectItemCaseSensitive(kc, "variants");
        if (list) {
            base = "kv_compression.variants";
            if (cJSON_GetArraySize(kc) != 1)
                return srv_fail(e, 400, "kv_compression", "kv_compression: give either variants or one "
                                "{method, ratio | tokens, params}, not both");
            if (!cJSON_IsArray(list)) return srv_fail(e, 400, base, "%s must be an array", base);
        }
    } else {
        return srv_fail(e, 400, "kv_compression",
                        "kv_compression must be an object {method, ratio | tokens, params} or {variants: [...]}");
    }
    if (list) {
        int n = cJSON_GetArraySize(list);
        if (n < 1) return srv_fail(e, 400, base, "%s must not be empty", base);
        const int maxv = s->cfg.batch > 64 ? s->cfg.batch : 64; /* --batch above 64 raises it */
        if (n > maxv) return srv_fail(e, 400, base, "%s: at most %d variants, got %d", base, maxv, n);
        g->variants = calloc((size_t)n, sizeof *g->variants);
        if (!g->variants) return srv_fail(e, 500, "", "out of memory");
        g->n_variants = n;
        g->several = 1;
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            char f[64];
            snprintf(f, sizeof f, "%s[%d]", base, i);
            if (parse_variant(s, it, f, &g->variants[i], e)) return -1;
            if (g->variants[i].chunk)
                return srv_fail(e, 400, g->variants[i].field, "%s.chunk: chunked compression runs one variant per "
                                "request (each variant would need its own prefill)", g->variants[i].field);
            i++;
        }
        return 0;
    }
    g->variants = calloc(1, sizeof *g->variants);
    if (!g->variants) return srv_fail(e, 500, "", "out of memory");
    g->n_variants = 1;
    return parse_variant(s, kc, "kv_compression", &g->variants[0], e);
}

kvs_compress_opts srv_variant_compress_opts(const kvs_server *s, const variant_req *v) {
    kvs_compress_opts co;
    memset(&co, 0, sizeof co);
    co.method = v->method;
    co.params = v->params;
    co.budget = v->budget;
    co.compress_local = v->compress_local;
    co.threads = s->cfg.threads;
    return co;
}
