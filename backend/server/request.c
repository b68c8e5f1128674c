/*
 * request.c -- request errors and JSON helpers shared by the server's files:
 * srv_fail (an error naming the JSON field), JSON and error responses, the
 * typed getters that validate request bodies, body parsing, UTF-8 checks and
 * the refusal of options the server does not implement.
 * What it is not: no server state (counters.c), no endpoint (server.c,
 * server_gen.c); it calls no other file of the server.
 */
#include "server_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and JSON helpers --------------------------------------------- */

int srv_fail(srv_error *e, int status, const char *field, const char *fmt, ...) {
    e->status = status;
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int srv_fail_kvs(srv_error *e, const kvs_err *err, const char *field) {
    int client = err->code == KVS_ERR_INVALID || err->code == KVS_ERR_NOTFOUND;
    return srv_fail(e, client ? 400 : 500, client ? field : "", "%s", err->msg);
}

void srv_json_response(kvs_http_response *resp, int status, cJSON *root) {
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        resp->status = 500;
        resp->body = malloc(sizeof oom);
        if (resp->body) memcpy(resp->body, oom, sizeof oom);
        resp->len = resp->body ? sizeof oom - 1 : 0;
        resp->content_type = "application/json";
        return;
    }
    resp->status = status;
    resp->body = text;
    resp->len = strlen(text);
    resp->content_type = "application/json";
}

void srv_error_response(kvs_http_response *resp, const srv_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->msg);
    if (e->field[0]) cJSON_AddStringToObject(o, "field", e->field);
    cJSON_AddStringToObject(o, "type", e->status >= 500   ? "server_error"
                                       : e->status == 401 ? "authentication_error"
                                       : e->status == 404 ? "not_found_error"
                                       : e->status == 503 ? "unavailable_error"
                                                          : "invalid_request_error");
    cJSON_AddNumberToObject(o, "code", e->status);
    srv_json_response(resp, e->status, root);
    resp->retry_after = e->retry_after;
}

static void field_name(char *buf, size_t n, const char *prefix, const char *name) {
    snprintf(buf, n, "%s%s%s", prefix ? prefix : "", prefix && prefix[0] ? "." : "", name);
}

int srv_get_int(const cJSON *obj, const char *name, const char *prefix, long long def, long long lo,
                long long hi, long long *out, srv_error *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    char f[192];
    field_name(f, sizeof f, prefix, name);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble != floor(it->valuedouble))
        return srv_fail(e, 400, f, "%s must be an integer", f);
    if (it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return srv_fail(e, 400, f, "%s must be in [%lld, %lld], got %.17g", f, lo, hi, it->valuedouble);
    *out = (long long)it->valuedouble;
    return 0;
}

int srv_get_double(const cJSON *obj, const char *name, const char *prefix, double def, double lo,
                   double hi, double *out, srv_error *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    char f[192];
    field_name(f, sizeof f, prefix, name);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return srv_fail(e, 400, f, "%s must be a number", f);
    if (it->valuedouble < lo || it->valuedouble > hi)
        return srv_fail(e, 400, f, "%s must be in [%g, %g], got %.17g", f, lo, hi, it->valuedouble);
    *out = it->valuedouble;
    return 0;
}

int srv_get_bool(const cJSON *obj, const char *name, const char *prefix, int def, int *out,
                 srv_error *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    char f[192];
    field_name(f, sizeof f, prefix, name);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(it)) return srv_fail(e, 400, f, "%s must be true or false", f);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return 0;
}

const char *srv_get_string(const cJSON *obj, const char *name, const char *prefix, const char *def,
                           srv_error *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    char f[192];
    field_name(f, sizeof f, prefix, name);
    if (!it || cJSON_IsNull(it)) return def;
    if (!cJSON_IsString(it)) {
        srv_fail(e, 400, f, "%s must be a string", f);
        return NULL;
    }
    return it->valuestring;
}

cJSON *srv_parse_body(const kvs_http_request *rq, srv_error *e) {
    if (rq->body_len == 0) {
        srv_fail(e, 400, "body", "request body is empty; expected a JSON object");
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(rq->body, rq->body_len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - rq->body) : 0;
        srv_fail(e, 400, "body", "request body is not valid JSON (error near byte %zu)", off);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_fail(e, 400, "body", "request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    unsigned cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

int srv_utf8_valid(const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(p + i, len - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

char *srv_utf8_clean(const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    char *out = malloc(3 * len + 1); /* each bad byte becomes 3 bytes at most */
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(p + i, len - i);
        if (k) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            out[o++] = (char)0xEF;
            out[o++] = (char)0xBF;
            out[o++] = (char)0xBD;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

/* Sampling and output options this server does not implement are refused
 * when set to anything but their neutral value, never silently ignored. */
int srv_refuse_unsupported(const cJSON *root, int scoring, srv_error *e) {
    static const struct {
        const char *name;
        double neutral;
    } nums[] = {{"n_probs", 0},   {"presence_penalty", 0}, {"frequency_penalty", 0}, {"repeat_penalty", 1},
                {"min_p", 0},     {"typical_p", 1},        {"mirostat", 0},          {"best_of", 1},
                {"top_logprobs", 0}};
    static const char *const msg = "%s is not supported by this server (it samples with temperature, top_k, "
                                   "top_p and seed, and stops on stop strings, EOS and n_predict / max_tokens)";
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, nums[i].name);
        if (it && !cJSON_IsNull(it) && !(cJSON_IsNumber(it) && it->valuedouble == nums[i].neutral))
            return srv_fail(e, 400, nums[i].name, msg, nums[i].name);
    }
    static const char *const flags[] = {"logprobs", "echo"};
    for (size_t i = 0; i < (scoring ? 0 : 2); i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, flags[i]);
        if (it && !cJSON_IsNull(it) && !cJSON_IsFalse(it) && !(cJSON_IsNumber(it) && it->valuedouble == 0))
            return srv_fail(e, 400, flags[i], msg, flags[i]);
    }
    static const char *const things[] = {"grammar", "json_schema", "tools", "logit_bias"};
    for (size_t i = 0; i < 4; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, things[i]);
        int empty = !it || cJSON_IsNull(it) || (cJSON_IsString(it) && !it->valuestring[0]) ||
                    ((cJSON_IsArray(it) || cJSON_IsObject(it)) && !it->child);
        if (!empty) return srv_fail(e, 400, things[i], msg, things[i]);
    }
    /* llama-server's image field: this engine has no vision encoder, so images
     * are refused, never dropped (an empty list asks for none) */
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(root, "multimodal_data");
    if (mm && !cJSON_IsNull(mm) && !(cJSON_IsArray(mm) && !mm->child))
        return srv_fail(e, 400, "multimodal_data",
                        "multimodal_data: this server is text-only; it takes no images (send the "
                        "request to a multimodal backend such as kvsieve-hf)");
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0)
            return srv_fail(e, 400, "response_format", "response_format: only {\"type\": \"text\"} is supported");
    }
    return 0;
}

int srv_prepend_bos(const kvs_server *s, int32_t **toks, int *n) {
    const kvs_special_tokens *sp = kvs_model_special(s->model);
    if (!s->cfg.prepend_bos || !sp->add_bos || sp->bos < 0 || *n < 1 || (*toks)[0] == sp->bos) return 0;
    int32_t *t = realloc(*toks, (size_t)(*n + 1) * sizeof *t);
    if (!t) return -1;
    memmove(t + 1, t, (size_t)*n * sizeof *t);
    t[0] = sp->bos;
    *toks = t;
    (*n)++;
    return 1;
}
