/*
 * server_gen.c -- generation endpoints, the kv_compression extension, /kv/dump
 * (kv_compression itself is parsed in kv_request.c).
 *
 * What it is: request parsing and validation for /completion (llama-server
 * shape), /v1/completions and /v1/chat/completions (OpenAI shape), one
 * prefill per request, then per variant a copy of the prefill session, its
 * compression (kvs_session_compress, timed as compress_ms) and the decode
 * loop with the sampler and stop rules; and the safetensors dump of a
 * prefill cache. Every refused request names the JSON field.
 * What it is not: the transport, routing and metrics text (server.c, http.c);
 * streaming responses (stream: true is refused with 400).
 *
 * Response extension (all three generation endpoints):
 *   "kv": {...}        statistics of the (first) variant's cache
 *   "variants": [...]  only when kv_compression listed several variants;
 *                      each {index, name, content, tokens, stop_type,
 *                      stopping_word, tokens_predicted, timings, kv}; the
 *                      top-level content/choices are those of variant 0.
 * The first generated token of every variant is sampled from the prefill's
 * logits (the compression only changes what later tokens attend to).
 */
#include "kvs_formats.h"
#include "kvs_parts.h"
#include "kvs_sampling.h"
#include "kvsieve_methods.h"
#include "server_internal.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void srv_gen_req_free(gen_req *g) {
    srv_variants_free(g);
    free(g->prompt);
    srv_spans_free(g);
    kvs_stop_free(&g->stop);
}

void gen_out_free(gen_out *o) {
    srv_chunk_log_free(&o->chunks);
    free(o->text);
    free(o->toks);
    free(o->span_kept);
}

/* ---- parsing ---------------------------------------------------------------- */

/* Prompt given as token ids: validate each. */
static int parse_token_array(const kvs_server *s, const cJSON *arr, const char *field, int32_t **out,
                             int *n_out, srv_error *e) {
    int n = cJSON_GetArraySize(arr);
    int32_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!t) return srv_fail(e, 500, "", "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char f[96];
        snprintf(f, sizeof f, "%s[%d]", field, i);
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= s->info->n_vocab) {
            free(t);
            return srv_fail(e, 400, f, "%s must be a token id in [0, %d)", f, s->info->n_vocab);
        }
        t[i++] = (int32_t)it->valuedouble;
    }
    if (srv_prepend_bos(s, &t, &n) < 0) {
        free(t);
        return srv_fail(e, 500, "", "out of memory");
    }
    *out = t;
    *n_out = n;
    return 0;
}

static int tokenize_text(const kvs_server *s, const char *text, int add_bos, const char *field,
                         int32_t **out, int *n_out, srv_error *e) {
    kvs_err err = {0};
    if (kvs_tokenize(s->model, text, strlen(text), add_bos, 1, out, n_out, &err) != KVS_OK)
        return srv_fail_kvs(e, &err, field);
    return 0;
}

static int parse_prompt(const kvs_server *s, const cJSON *root, gen_req *g, srv_error *e) {
    const int add_bos = kvs_model_special(s->model)->add_bos;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    g->prompt_field = "prompt";
    if (!p || cJSON_IsNull(p)) return srv_fail(e, 400, "prompt", "prompt is required");
    if (cJSON_IsString(p)) return tokenize_text(s, p->valuestring, add_bos, "prompt", &g->prompt, &g->n_prompt, e);
    if (cJSON_IsArray(p)) {
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (first && cJSON_IsString(first)) { /* OpenAI: a list of prompts; we serve one */
            if (cJSON_GetArraySize(p) != 1)
                return srv_fail(e, 400, "prompt", "prompt: only one prompt per request is supported, got %d",
                                cJSON_GetArraySize(p));
            return tokenize_text(s, first->valuestring, add_bos, "prompt[0]", &g->prompt, &g->n_prompt, e);
        }
        if (first && cJSON_IsArray(first)) { /* [[ids]] (lm-eval's batch of one); several: logprobs.c */
            if (cJSON_GetArraySize(p) != 1)
                return srv_fail(e, 400, "prompt", "prompt: only one prompt per request is supported here, got %d",
                                cJSON_GetArraySize(p));
            return parse_token_array(s, first, "prompt[0]", &g->prompt, &g->n_prompt, e);
        }
        return parse_token_array(s, p, "prompt", &g->prompt, &g->n_prompt, e);
    }
    return srv_fail(e, 400, "prompt", "prompt must be a string or an array of token ids");
}

static int parse_messages(const kvs_server *s, const cJSON *root, gen_req *g, srv_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    g->prompt_field = "messages";
    if (!msgs || cJSON_IsNull(msgs)) return srv_fail(e, 400, "messages", "messages is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return srv_fail(e, 400, "messages", "messages must be a non-empty array of {role, content}");
    int n = cJSON_GetArraySize(msgs);
    kvs_chat_msg *cm = calloc((size_t)n, sizeof *cm);
    char **owned = calloc((size_t)n, sizeof *owned);
    char *templ = NULL;
    int rc = 0;
    if (!cm || !owned) {
        rc = srv_fail(e, 500, "", "out of memory");
        goto done;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char f[64];
        snprintf(f, sizeof f, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            rc = srv_fail(e, 400, f, "%s must be an object {role, content}", f);
            goto done;
        }
        const char *role = srv_get_string(m, "role", f, NULL, e);
        if (e->status) {
            rc = -1;
            goto done;
        }
        char ff[96];
        snprintf(ff, sizeof ff, "%s.role", f);
        if (!role) {
            rc = srv_fail(e, 400, ff, "%s is required", ff);
            goto done;
        }
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            rc = srv_fail(e, 400, ff, "%s must be system, user or assistant, got '%s'", ff, role);
            goto done;
        }
        snprintf(ff, sizeof ff, "%s.content", f);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!c || cJSON_IsNull(c)) {
            rc = srv_fail(e, 400, ff, "%s is required", ff);
            goto done;
        }
        if (cJSON_IsString(c)) {
            cm[i].content = c->valuestring;
        } else if (cJSON_IsArray(c)) { /* content parts: text only for now */
            size_t total = 0;
            const cJSON *part;
            int j = 0;
            cJSON_ArrayForEach(part, c) {
                char pf[128];
                snprintf(pf, sizeof pf, "%s[%d].type", ff, j);
                const char *type = cJSON_IsObject(part) ? srv_get_string(part, "type", NULL, NULL, e) : NULL;
                if (e->status) {
                    rc = srv_fail(e, 400, pf, "%s must be a string", pf);
                    goto done;
                }
                if (!type || strcmp(type, "text") != 0) {
                    rc = srv_fail(e, 400, pf, "%s: only \"text\" parts are supported, got %s", pf,
                                  type ? type : "none");
                    goto done;
                }
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(tx)) {
                    snprintf(pf, sizeof pf, "%s[%d].text", ff, j);
                    rc = srv_fail(e, 400, pf, "%s must be a string", pf);
                    goto done;
                }
                total += strlen(tx->valuestring);
                j++;
            }
            owned[i] = malloc(total + 1);
            if (!owned[i]) {
                rc = srv_fail(e, 500, "", "out of memory");
                goto done;
            }
            size_t o = 0;
            cJSON_ArrayForEach(part, c) {
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                size_t k = strlen(tx->valuestring);
                memcpy(owned[i] + o, tx->valuestring, k);
                o += k;
            }
            owned[i][o] = '\0';
            cm[i].content = owned[i];
        } else {
            rc = srv_fail(e, 400, ff, "%s must be a string or an array of text parts", ff);
            goto done;
        }
        cm[i].role = role;
        i++;
    }
    kvs_err err = {0};
    if (kvs_chat_apply(s->model, cm, n, 1, &templ, &err) != KVS_OK) {
        rc = srv_fail_kvs(e, &err, "messages");
        goto done;
    }
    /* the template carries BOS text where the family wants it */
    rc = tokenize_text(s, templ, 0, "messages", &g->prompt, &g->n_prompt, e);
done:
    if (owned)
        for (int k = 0; k < n; k++) free(owned[k]);
    free(owned);
    free(cm);
    free(templ);
    return rc;
}


static int parse_stop(const cJSON *root, gen_req *g, srv_error *e) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stop");
    kvs_err err = {0};
    if (!st || cJSON_IsNull(st)) return 0;
    if (cJSON_IsString(st)) {
        if (!st->valuestring[0]) return 0; /* OpenAI clients send "" for none */
        if (kvs_stop_add_string(&g->stop, st->valuestring, &err) != KVS_OK) return srv_fail(e, 400, "stop", "%s", err.msg);
        return 0;
    }
    if (!cJSON_IsArray(st)) return srv_fail(e, 400, "stop", "stop must be a string or an array of strings");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, st) {
        char f[32];
        snprintf(f, sizeof f, "stop[%d]", i++);
        if (!cJSON_IsString(it)) return srv_fail(e, 400, f, "%s must be a string", f);
        if (!it->valuestring[0]) return srv_fail(e, 400, f, "%s must not be empty", f);
        if (kvs_stop_add_string(&g->stop, it->valuestring, &err) != KVS_OK) return srv_fail(e, 400, f, "%s: %s", f, err.msg);
    }
    return 0;
}

int srv_parse_gen_request(kvs_server *s, int ep, const cJSON *root, gen_req *g, srv_error *e) {
    int stream = 0;
    if (srv_refuse_unsupported(root, 0, e)) return -1;
    if (srv_get_bool(root, "stream", "", 0, &stream, e)) return -1;
    if (stream) return srv_fail(e, 400, "stream", "stream: streaming responses are not supported; send stream: false");
    if (ep != EP_COMPLETION) {
        long long nn;
        if (srv_get_int(root, "n", "", 1, 1, 1, &nn, e)) return -1;
    }
    kvs_sampling_defaults(&g->sp);
    if (srv_get_double(root, "temperature", "", 0.0, 0.0, 1e6, &g->sp.temperature, e)) return -1;
    long long k;
    if (srv_get_int(root, "top_k", "", 0, 0, 2147483647LL, &k, e)) return -1;
    g->sp.top_k = (int)(k > s->info->n_vocab ? s->info->n_vocab : k);
    if (srv_get_double(root, "top_p", "", 1.0, 0.0, 1.0, &g->sp.top_p, e)) return -1;
    if (g->sp.top_p <= 0.0) return srv_fail(e, 400, "top_p", "top_p must be in (0, 1], got 0");
    long long seed;
    if (srv_get_int(root, "seed", "", -1, -1, 9007199254740991LL, &seed, e)) return -1;
    if (seed < 0) { /* like llama-server's -1: a fresh seed, reported back */
        uint64_t st = (uint64_t)(kvs_now_ms() * 1000.0) ^ (srv_next_id(s) << 32);
        g->sp.seed = kvs_rng_next(&st) >> 11; /* fits a JSON number exactly */
    } else {
        g->sp.seed = (uint64_t)seed;
    }
    long long np = -1;
    const char *npf = "n_predict";
    if (ep == EP_COMPLETION) {
        if (srv_get_int(root, "n_predict", "", -1, -1, 2147483647LL, &np, e)) return -1;
    } else {
        const cJSON *mct = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens");
        npf = mct && !cJSON_IsNull(mct) ? "max_completion_tokens" : "max_tokens";
        if (srv_get_int(root, npf, "", -1, -1, 2147483647LL, &np, e)) return -1;
    }
    if (np > s->cfg.n_predict_max)
        return srv_fail(e, 400, npf, "%s = %lld is above this server's cap of %d tokens (--n-predict-max); ask for "
                        "at most that, or -1 for up to the cap", npf, np, s->cfg.n_predict_max);
    g->n_predict = (int)np;
    g->limit = np < 0 ? s->cfg.n_predict_max : (int)np;
    if (srv_get_bool(root, "ignore_eos", "", 0, &g->ignore_eos, e)) return -1;
    kvs_stop_init(&g->stop, g->n_predict);
    if (parse_stop(root, g, e)) return -1;
    if (srv_parse_kv_compression(s, srv_kv_compression(s, root), g, e)) return -1;
    /* the prompt last: tokenising is the costly part */
    if (ep == EP_V1_CHAT) {
        if (parse_messages(s, root, g, e)) return -1;
    } else if (parse_prompt(s, root, g, e)) {
        return -1;
    }
    if (g->n_prompt < 1) return srv_fail(e, 400, g->prompt_field, "%s is empty (no tokens)", g->prompt_field);
    const char *text = NULL; /* the prompt string kv_spans refers to */
    if (ep != EP_V1_CHAT) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (cJSON_IsString(p)) text = p->valuestring;
        else if (cJSON_IsArray(p) && cJSON_IsString(cJSON_GetArrayItem(p, 0))) text = cJSON_GetArrayItem(p, 0)->valuestring;
    }
    if (srv_join_suffixes(s, text, g, e)) return -1;
    if (g->n_prompt > s->cfg.n_ctx)
        return srv_fail(e, 400, g->prompt_field,
                        "%s has %d tokens, more than the context of %d; it is not truncated: shorten it or "
                        "start the server with a larger --ctx",
                        g->prompt_field, g->n_prompt, s->cfg.n_ctx);
    for (int i = 0; i < g->n_variants; i++) {
        kvs_err err = {0};
        int per_layer;
        if (kvs_budget_per_layer(&g->variants[i].budget, g->n_prompt, &per_layer, &err) != KVS_OK) {
            char f[96];
            snprintf(f, sizeof f, "%s.%s", g->variants[i].field, g->variants[i].budget.tokens ? "tokens" : "ratio");
            return srv_fail(e, 400, f, "%s: %s", f, err.msg);
        }
        if (g->n_prompt + g->variants[i].n_suffix > s->cfg.n_ctx) {
            char f[96];
            snprintf(f, sizeof f, "%s.suffix", g->variants[i].field);
            return srv_fail(e, 400, f, "%s: prompt (%d tokens) + suffix (%d) exceed the context of %d", f,
                            g->n_prompt, g->variants[i].n_suffix, s->cfg.n_ctx);
        }
    }
    if (srv_parse_spans(s, root, text, g, e)) return -1;
    if (g->n_spans && g->n_variants && g->variants[0].chunk)
        return srv_fail(e, 400, "kv_spans", "kv_spans: not available with kv_compression.chunk (several plans)");
    return 0;
}

/* ---- responses ----------------------------------------------------------------- */

static cJSON *timings_json(int prompt_n, double prompt_ms, const gen_out *o) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "prompt_n", prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", prompt_n ? prompt_ms / prompt_n : 0.0);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? 1e3 * prompt_n / prompt_ms : 0.0);
    cJSON_AddNumberToObject(t, "predicted_n", o->n_toks);
    cJSON_AddNumberToObject(t, "predicted_ms", o->predicted_ms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", o->n_toks ? o->predicted_ms / o->n_toks : 0.0);
    cJSON_AddNumberToObject(t, "predicted_per_second",
                            o->predicted_ms > 0 ? 1e3 * o->n_toks / o->predicted_ms : 0.0);
    cJSON_AddNumberToObject(t, "compress_ms", o->compress_ms);
    cJSON_AddNumberToObject(t, "suffix_ms", o->suffix_ms);
    return t;
}

static void add_param_values(cJSON *obj, const kvs_method *m, const kvs_params *p) {
    for (int i = 0; i < m->n_params; i++) {
        const kvs_param_def *d = &m->params[i];
        if (d->type == KVS_PARAM_BOOL) {
            cJSON_AddBoolToObject(obj, d->name, p->v[i] != 0.0);
        } else if (d->type == KVS_PARAM_ENUM) {
            char buf[64];
            kvs_param_format(d, p->v[i], buf, sizeof buf);
            cJSON_AddStringToObject(obj, d->name, buf);
        } else {
            cJSON_AddNumberToObject(obj, d->name, p->v[i]);
        }
    }
}

static cJSON *kv_json(const gen_req *g, const variant_req *v, const gen_out *o) {
    const kvs_kv_stats *st = &o->stats;
    cJSON *kv = cJSON_CreateObject();
    cJSON_AddStringToObject(kv, "method", v && v->method ? v->method->name : "none");
    cJSON *params = cJSON_AddObjectToObject(kv, "params");
    if (v && v->method) add_param_values(params, v->method, &v->params);
    cJSON *b = cJSON_AddObjectToObject(kv, "budget");
    if (v && v->budget.tokens) cJSON_AddNumberToObject(b, "tokens", (double)v->budget.tokens);
    else cJSON_AddNumberToObject(b, "ratio", v ? v->budget.ratio : 1.0);
    cJSON_AddBoolToObject(kv, "compress_local", v && v->compress_local);
    if (v && v->chunk) { /* chunked: what each compression kept (rows of a compressed layer per KV head) */
        cJSON_AddNumberToObject(kv, "chunk", v->chunk);
        cJSON *ch = cJSON_AddArrayToObject(kv, "chunks");
        for (int i = 0; i < o->chunks.n; i++) {
            const int *r = o->chunks.rows + (size_t)i * 3;
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "seen", r[0]);
            cJSON_AddNumberToObject(c, "rows_before", r[1]);
            cJSON_AddNumberToObject(c, "rows_after", r[2]);
            cJSON_AddItemToArray(ch, c);
        }
    }
    cJSON_AddNumberToObject(kv, "compress_ms", o->compress_ms);
    cJSON_AddNumberToObject(kv, "copy_ms", o->copy_ms);
    cJSON_AddNumberToObject(kv, "n_prompt", st->n_prompt);
    int64_t tb = 0, ta = 0;
    cJSON *layers = cJSON_CreateArray();
    for (int l = 0; l < st->n_layers; l++) {
        tb += st->tokens_before[l];
        ta += st->tokens_after[l];
        cJSON *ly = cJSON_CreateObject();
        cJSON_AddNumberToObject(ly, "layer", l);
        cJSON_AddBoolToObject(ly, "local", st->is_local[l]);
        cJSON_AddBoolToObject(ly, "compressed", st->compressed[l]);
        cJSON_AddNumberToObject(ly, "tokens_before", (double)st->tokens_before[l]);
        cJSON_AddNumberToObject(ly, "tokens_after", (double)st->tokens_after[l]);
        cJSON_AddNumberToObject(ly, "bytes_before", (double)st->bytes_before[l]);
        cJSON_AddNumberToObject(ly, "bytes_after", (double)st->bytes_after[l]);
        cJSON_AddItemToArray(layers, ly);
    }
    cJSON_AddNumberToObject(kv, "tokens_before", (double)tb);
    cJSON_AddNumberToObject(kv, "tokens_after", (double)ta);
    cJSON_AddNumberToObject(kv, "bytes_before", (double)st->bytes_before_total);
    cJSON_AddNumberToObject(kv, "bytes_after", (double)st->bytes_after_total);
    cJSON_AddNumberToObject(kv, "bytes_before_global", (double)st->bytes_before_global);
    cJSON_AddNumberToObject(kv, "bytes_after_global", (double)st->bytes_after_global);
    cJSON_AddNumberToObject(kv, "bytes_before_local", (double)st->bytes_before_local);
    cJSON_AddNumberToObject(kv, "bytes_after_local", (double)st->bytes_after_local);
    if (v && v->compress_suffix && v->suffix_apart && v->n_suffix > 0) {
        char note[sizeof st->note + 96];
        snprintf(note, sizeof note, "%s%scompress_suffix tokenized apart from the prompt", st->note,
                 st->note[0] ? "; " : "");
        cJSON_AddStringToObject(kv, "note", note);
    } else
        cJSON_AddStringToObject(kv, "note", st->note);
    cJSON_AddBoolToObject(kv, "compress_suffix", v && v->compress_suffix);
    cJSON_AddItemToObject(kv, "layers", layers);
    if (g->n_spans > 0 && o->span_kept) {
        cJSON *sk = cJSON_AddArrayToObject(kv, "span_kept");
        for (int k = 0; k < g->n_spans; k++) {
            cJSON *row = cJSON_CreateArray();
            for (int l = 0; l < st->n_layers; l++)
                cJSON_AddItemToArray(row, cJSON_CreateNumber(o->span_kept[(size_t)k * st->n_layers + l]));
            cJSON_AddItemToArray(sk, row);
        }
    }
    return kv;
}

static const char *oai_finish(const gen_out *o) { return strcmp(o->stop_type, "limit") == 0 ? "length" : "stop"; }

static cJSON *variant_json(const gen_req *g, int i, const variant_req *v, const gen_out *o, const char *clean,
                           int prompt_n, double prompt_ms) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", i);
    cJSON_AddStringToObject(j, "name", v && v->name[0] ? v->name : (v && v->method ? v->method->name : "none"));
    cJSON_AddStringToObject(j, "content", clean);
    cJSON *toks = cJSON_AddArrayToObject(j, "tokens");
    for (int t = 0; t < o->n_toks; t++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(o->toks[t]));
    cJSON_AddStringToObject(j, "stop_type", o->stop_type);
    cJSON_AddStringToObject(j, "stopping_word", o->stopping_word);
    cJSON_AddStringToObject(j, "finish_reason", oai_finish(o));
    cJSON_AddNumberToObject(j, "tokens_predicted", o->n_toks);
    /* compress_suffix: the suffix was prefilled with the prompt (before the compression) */
    cJSON_AddItemToObject(j, "timings", timings_json(prompt_n + o->n_extend, prompt_ms + o->extend_ms, o));
    cJSON_AddItemToObject(j, "kv", kv_json(g, v, o));
    if (o->same_as >= 0) cJSON_AddNumberToObject(j, "same_as", o->same_as);
    else cJSON_AddNullToObject(j, "same_as");
    return j;
}

static cJSON *settings_json(const kvs_server *s, const gen_req *g) {
    cJSON *gs = cJSON_CreateObject();
    cJSON_AddNumberToObject(gs, "n_ctx", s->cfg.n_ctx);
    cJSON_AddNumberToObject(gs, "n_predict", g->n_predict);
    cJSON_AddNumberToObject(gs, "n_predict_max", s->cfg.n_predict_max);
    cJSON_AddBoolToObject(gs, "ignore_eos", g->ignore_eos);
    cJSON_AddNumberToObject(gs, "temperature", g->sp.temperature);
    cJSON_AddNumberToObject(gs, "top_k", g->sp.top_k);
    cJSON_AddNumberToObject(gs, "top_p", g->sp.top_p);
    cJSON_AddNumberToObject(gs, "seed", (double)g->sp.seed);
    cJSON *stop = cJSON_AddArrayToObject(gs, "stop");
    for (int i = 0; i < g->stop.n_strings; i++) cJSON_AddItemToArray(stop, cJSON_CreateString(g->stop.strings[i]));
    return gs;
}

static cJSON *build_response(kvs_server *s, int ep, const gen_req *g, const gen_out *outs, int n_outs,
                             char **clean, double prompt_ms) {
    const gen_out *o = &outs[0];
    const variant_req *v0 = g->n_variants ? &g->variants[0] : NULL;
    cJSON *root = cJSON_CreateObject();
    uint64_t id = srv_next_id(s);
    if (ep == EP_COMPLETION) {
        cJSON_AddStringToObject(root, "content", clean[0]);
        cJSON *toks = cJSON_AddArrayToObject(root, "tokens");
        for (int t = 0; t < o->n_toks; t++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(o->toks[t]));
        cJSON_AddNumberToObject(root, "id_slot", 0);
        cJSON_AddBoolToObject(root, "stop", 1);
        cJSON_AddStringToObject(root, "model", s->alias);
        cJSON_AddNumberToObject(root, "tokens_predicted", o->n_toks);
        cJSON_AddNumberToObject(root, "tokens_evaluated", g->n_prompt);
        cJSON_AddItemToObject(root, "generation_settings", settings_json(s, g));
        cJSON_AddBoolToObject(root, "truncated", 0);
        cJSON_AddStringToObject(root, "stop_type", o->stop_type);
        cJSON_AddStringToObject(root, "stopping_word", o->stopping_word);
        cJSON_AddNumberToObject(root, "tokens_cached", g->n_prompt + o->n_toks);
    } else {
        char idbuf[64];
        snprintf(idbuf, sizeof idbuf, "%s-%llu", ep == EP_V1_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)id);
        cJSON_AddStringToObject(root, "id", idbuf);
        cJSON_AddStringToObject(root, "object", ep == EP_V1_CHAT ? "chat.completion" : "text_completion");
        cJSON_AddNumberToObject(root, "created", (double)time(NULL));
        cJSON_AddStringToObject(root, "model", s->alias);
        cJSON *choices = cJSON_AddArrayToObject(root, "choices");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        if (ep == EP_V1_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddStringToObject(msg, "content", clean[0]);
        } else {
            cJSON_AddStringToObject(c, "text", clean[0]);
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", oai_finish(o));
        cJSON_AddItemToArray(choices, c);
        cJSON *u = cJSON_AddObjectToObject(root, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", g->n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", o->n_toks);
        cJSON_AddNumberToObject(u, "total_tokens", g->n_prompt + o->n_toks);
        cJSON_AddStringToObject(root, "system_fingerprint", "kvsieve-" KVS_VERSION);
    }
    cJSON_AddItemToObject(root, "timings", timings_json(g->n_prompt + o->n_extend, prompt_ms + o->extend_ms, o));
    cJSON_AddItemToObject(root, "kv", kv_json(g, v0, o));
    if (g->several) {
        cJSON *vs = cJSON_AddArrayToObject(root, "variants");
        for (int i = 0; i < n_outs; i++)
            cJSON_AddItemToArray(vs, variant_json(g, i, &g->variants[i], &outs[i], clean[i], g->n_prompt, prompt_ms));
    }
    return root;
}

void srv_handle_generate(kvs_server *s, int ep, const kvs_http_request *rq, kvs_http_response *rs) {
    srv_error e = {0};
    gen_req g;
    memset(&g, 0, sizeof g);
    kvs_stop_init(&g.stop, -1);
    gen_out *outs = NULL;
    char **clean = NULL;
    int n_outs = 0;
    cJSON *root = srv_parse_body(rq, &e);
    if (!root) goto fail;
    if (ep == EP_V1_COMPLETIONS && srv_wants_scoring(root)) { /* echo, logprobs, several prompts */
        srv_handle_scoring(s, root, rq, rs);
        goto cleanup;
    }
    if (srv_parse_gen_request(s, ep, root, &g, &e)) goto fail;
    n_outs = g.n_variants > 0 ? g.n_variants : 1;
    outs = calloc((size_t)n_outs, sizeof *outs);
    clean = calloc((size_t)n_outs, sizeof *clean);
    if (!outs || !clean) {
        srv_fail(&e, 500, "", "out of memory");
        goto fail;
    }
    double prompt_ms = 0.0;
    if (srv_sched_generate(s, &g, outs, n_outs, &prompt_ms, rq->fd, &e)) {
        if (e.status == 0) { /* the client hung up: nothing to send */
            rs->status = 0;
            goto cleanup;
        }
        goto fail;
    }
    for (int i = 0; i < n_outs; i++) {
        clean[i] = srv_utf8_clean(outs[i].text ? outs[i].text : "", outs[i].len);
        if (!clean[i]) {
            srv_fail(&e, 500, "", "out of memory");
            goto fail;
        }
    }
    cJSON *resp = build_response(s, ep, &g, outs, n_outs, clean, prompt_ms);
    srv_json_response(rs, 200, resp);
    goto cleanup;
fail:
    srv_error_response(rs, &e);
cleanup:
    if (outs)
        for (int i = 0; i < n_outs; i++) gen_out_free(&outs[i]);
    if (clean)
        for (int i = 0; i < n_outs; i++) free(clean[i]);
    free(outs);
    free(clean);
    srv_gen_req_free(&g);
    cJSON_Delete(root);
}

/* ---- /kv/dump ------------------------------------------------------------------ */

static int read_file(const char *path, char **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int rc = -1;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto done;
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) goto done;
    buf = malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) goto done;
    *out = buf;
    *n = (size_t)sz;
    buf = NULL;
    rc = 0;
done:
    free(buf);
    fclose(f);
    return rc;
}

/* The dump's model work, run on the scheduler thread between decode steps:
 * prefill, then copy the cache view into an owned fp32 cache. */
typedef struct {
    const gen_req *g;
    int nq, include_local;
    kvs_session *ses;
    kvs_layer *layers;
    int *layer_map;
    int n_mapped;
    kvs_dense_cache *dc;
} dump_job;

static int dump_run(kvs_server *s, void *user, srv_error *e) {
    dump_job *dj = user;
    const gen_req *g = dj->g;
    kvs_layer *layers = dj->layers;
    int *layer_map = dj->layer_map;
    kvs_dense_cache *dcp = dj->dc;
    kvs_err err = {0};
    kvs_session_opts so;
    memset(&so, 0, sizeof so);
    so.n_ctx = s->cfg.n_ctx;
    so.n_threads = s->cfg.threads;
    so.record_queries = dj->nq;
    so.cache_type = s->cfg.cache_type;
    so.cache_type_v = s->cfg.cache_type_v;
    if (kvs_session_new(s->model, &so, &dj->ses, &err) != KVS_OK) {
        srv_fail(e, 500, "", "cannot create a session: %s", err.msg);
        return -1;
    }
    double t0 = kvs_now_ms();
    if (kvs_session_prefill(dj->ses, g->prompt, g->n_prompt, NULL, NULL, &err) != KVS_OK) {
        srv_fail_kvs(e, &err, "prompt");
        return -1;
    }
    srv_note_prefill(s, g->n_prompt, kvs_now_ms() - t0);
    kvs_cache_view cv;
    if (kvs_session_cache_view(dj->ses, dj->include_local, &cv, layers, layer_map, &dj->n_mapped, &err) != KVS_OK) {
        srv_fail_kvs(e, &err, "include_local");
        return -1;
    }
    /* copy the view into an owned fp32 cache: [Hkv][N][d] per layer */
    dcp->n_layers = cv.n_layers;
    dcp->n_tokens = g->n_prompt;
    dcp->layers = calloc((size_t)cv.n_layers, sizeof *dcp->layers);
    if (!dcp->layers) {
        srv_fail(e, 500, "", "out of memory");
        return -1;
    }
    for (int l = 0; l < cv.n_layers; l++) {
        const kvs_layer *in = &cv.layers[l];
        kvs_dense_layer *o = &dcp->layers[l];
        const int H = in->k.n_heads, N = in->k.n_tokens, d = in->k.head_dim;
        o->n_tokens = N;
        o->n_kv_heads = H;
        o->head_dim = d;
        o->k = malloc((size_t)H * N * d * sizeof *o->k);
        o->v = malloc((size_t)H * N * d * sizeof *o->v);
        if (!o->k || !o->v) {
            srv_fail(e, 500, "", "out of memory for layer %d", l);
            return -1;
        }
        for (int h = 0; h < H; h++) {
            kvs_view_rows_f32(&in->k, h, 0, N, o->k + (size_t)h * N * d);
            kvs_view_rows_f32(&in->v, h, 0, N, o->v + (size_t)h * N * d);
        }
        if (in->q.data) {
            const int Hq = in->q.n_heads, Nq = in->q.n_tokens;
            o->n_q_heads = Hq;
            o->n_queries = Nq;
            o->q = malloc((size_t)Hq * Nq * d * sizeof *o->q); /* [Hq][Nq][d] */
            if (!o->q) {
                srv_fail(e, 500, "", "out of memory for layer %d queries", l);
                return -1;
            }
            for (int h = 0; h < Hq; h++) kvs_view_rows_f32(&in->q, h, 0, Nq, o->q + (size_t)h * Nq * d);
        }
    }
    return 0;
}

void srv_handle_kv_dump(kvs_server *s, const kvs_http_request *rq, kvs_http_response *rs) {
    srv_error e = {0};
    kvs_err err = {0};
    gen_req g;
    memset(&g, 0, sizeof g);
    kvs_stop_init(&g.stop, 0);
    kvs_session *ses = NULL;
    kvs_layer *layers = NULL;
    int *layer_map = NULL;
    kvs_dense_cache dc;
    memset(&dc, 0, sizeof dc);
    char dir[] = "/tmp/kvsieve-dump-XXXXXX";
    char path[sizeof dir + 32] = "";
    int have_dir = 0;
    char *body = NULL;
    size_t body_n = 0;
    cJSON *root = srv_parse_body(rq, &e);
    if (!root) goto fail;
    const char *dt = srv_get_string(root, "dtype", "", "F32", &e);
    if (!dt) goto fail;
    kvs_dtype dtype;
    if (strcmp(dt, "F32") == 0) dtype = KVS_F32;
    else if (strcmp(dt, "F16") == 0) dtype = KVS_F16;
    else if (strcmp(dt, "BF16") == 0) dtype = KVS_BF16;
    else {
        srv_fail(&e, 400, "dtype", "dtype must be F32, F16 or BF16, got '%s'", dt);
        goto fail;
    }
    long long nq;
    int include_local;
    if (srv_get_int(root, "queries", "", 0, -1, 2147483647LL, &nq, &e)) goto fail;
    if (srv_get_bool(root, "include_local", "", 1, &include_local, &e)) goto fail;
    if (parse_prompt(s, root, &g, &e)) goto fail;
    if (g.n_prompt < 1) {
        srv_fail(&e, 400, "prompt", "prompt is empty (no tokens)");
        goto fail;
    }
    if (g.n_prompt > s->cfg.n_ctx) {
        srv_fail(&e, 400, "prompt", "prompt has %d tokens, more than the context of %d; it is not truncated",
                 g.n_prompt, s->cfg.n_ctx);
        goto fail;
    }
    if (nq > g.n_prompt) nq = -1;
    layers = calloc(KVS_MAX_LAYERS, sizeof *layers);
    layer_map = calloc(KVS_MAX_LAYERS, sizeof *layer_map);
    if (!layers || !layer_map) {
        srv_fail(&e, 500, "", "out of memory");
        goto fail;
    }
    dump_job dj = {&g, (int)nq, include_local, NULL, layers, layer_map, 0, &dc};
    int rc = srv_sched_exclusive(s, dump_run, &dj, rq->fd, &e);
    ses = dj.ses;
    int n_mapped = dj.n_mapped;
    if (rc) {
        if (e.status == 0) {
            rs->status = 0;
            goto cleanup;
        }
        goto fail;
    }
    char map_text[KVS_MAX_LAYERS * 5 + 2] = "";
    size_t mo = 0;
    for (int l = 0; l < n_mapped && mo + 6 < sizeof map_text; l++)
        mo += (size_t)snprintf(map_text + mo, sizeof map_text - mo, "%s%d", l ? "," : "", layer_map[l]);
    char nbuf[32];
    snprintf(nbuf, sizeof nbuf, "%d", g.n_prompt);
    const char *meta[] = {"generator", "kvsieve serve /kv/dump", "model", s->info->name, "arch", s->info->arch,
                          "n_prompt", nbuf, "layer_map", map_text, NULL};
    if (!mkdtemp(dir)) {
        srv_fail(&e, 500, "", "cannot create a temporary folder for the dump");
        goto fail;
    }
    have_dir = 1;
    snprintf(path, sizeof path, "%s/dump.safetensors", dir);
    if (kvs_dump_write(path, &dc, dtype, NULL, 0, 0, NULL, 0, meta, &err) != KVS_OK) {
        srv_fail(&e, 500, "", "writing the dump failed: %s", err.msg);
        goto fail;
    }
    if (read_file(path, &body, &body_n)) {
        srv_fail(&e, 500, "", "cannot read back the dump %s", path);
        goto fail;
    }
    rs->status = 200;
    rs->body = body;
    rs->len = body_n;
    rs->content_type = "application/octet-stream";
    goto cleanup;
fail:
    srv_error_response(rs, &e);
cleanup:
    if (path[0]) unlink(path);
    if (have_dir) rmdir(dir);
    kvs_dense_cache_free(&dc);
    kvs_session_free(ses);
    free(layers);
    free(layer_map);
    srv_gen_req_free(&g);
    cJSON_Delete(root);
}
