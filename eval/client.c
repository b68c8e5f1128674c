/*
 * client.c -- HTTP client of the task runner (see kvs_client.h): request
 * bodies, a curl multi loop with per-URL concurrency, retries with backoff,
 * and answer parsing for the kvsieve `variants` extension and plain
 * OpenAI-compatible completions.
 *
 * What it is not: no prompts, metrics or storage (task.c), no threads (the
 * caller drives everything through kvs_client_poll).
 */
#include "kvs_client.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ANSWER (256u << 20) /* largest answer body accepted */
#define MAX_BACKOFF_MS 30000.0

typedef struct job {
    struct job *next;
    char *body; /* request JSON */
    void *tag;
    int n_variants;
    int n_spans; /* kv_spans sent */
    int attempts;
    int pref_url; /* URL of the next try */
    int url;      /* URL of the running / last try */
    int running;
    double not_before, t_submit; /* kvs_now_ms() */
    CURL *easy;
    struct curl_slist *hdr;
    char *resp; /* [resp_len + 1] answer body */
    size_t resp_len, resp_cap;
    int too_big;
    char errbuf[CURL_ERROR_SIZE];
} job;

struct kvs_client {
    kvs_client_opts o;
    char **urls;    /* [n_urls] copies */
    char *model;    /* copy or NULL */
    int *in_flight; /* [n_urls] */
    CURLM *multi;
    job *head, *tail; /* submission order */
    int n_jobs;
};

void kvs_client_opts_defaults(kvs_client_opts *o) {
    memset(o, 0, sizeof *o);
    o->api = KVS_API_KVSIEVE;
    o->per_url = 2;
    o->connect_timeout_s = 10;
    o->timeout_s = 900;
    o->max_attempts = 5;
    o->backoff_ms = 250;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

kvs_status kvs_client_new(const kvs_client_opts *o, kvs_client **out, kvs_err *err) {
    *out = NULL;
    if (!o || o->n_urls < 1 || !o->urls)
        return kvs_errorf(err, KVS_ERR_INVALID, "client: at least one backend URL is required");
    for (int i = 0; i < o->n_urls; i++)
        if (!o->urls[i] || (strncmp(o->urls[i], "http://", 7) && strncmp(o->urls[i], "https://", 8)))
            return kvs_errorf(err, KVS_ERR_INVALID, "client: url[%d] '%s' is not an http(s):// URL", i,
                              o->urls[i] ? o->urls[i] : "(null)");
    if (o->per_url < 1 || o->max_attempts < 1 || !(o->timeout_s > 0) || !(o->connect_timeout_s > 0) ||
        !(o->backoff_ms >= 0))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "client: per_url, max_attempts >= 1 and positive timeouts are required");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "client: curl_global_init failed");
    kvs_client *c = calloc(1, sizeof *c);
    if (!c) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    c->o = *o;
    c->urls = calloc((size_t)o->n_urls, sizeof *c->urls);
    c->in_flight = calloc((size_t)o->n_urls, sizeof *c->in_flight);
    c->multi = curl_multi_init();
    if (!c->urls || !c->in_flight || !c->multi) goto nomem;
    for (int i = 0; i < o->n_urls; i++) {
        c->urls[i] = dup_str(o->urls[i]);
        if (!c->urls[i]) goto nomem;
        size_t n = strlen(c->urls[i]);
        while (n > 0 && c->urls[i][n - 1] == '/') c->urls[i][--n] = '\0';
    }
    if (o->model && !(c->model = dup_str(o->model))) goto nomem;
    c->o.urls = NULL;
    c->o.model = NULL;
    /* connection cache shared by every transfer of this multi handle: keep-alive */
    curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)o->per_url);
    *out = c;
    return KVS_OK;
nomem:
    kvs_client_free(c);
    return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
}

static void job_free(kvs_client *c, job *j) {
    if (!j) return;
    if (j->easy) {
        if (j->running) curl_multi_remove_handle(c->multi, j->easy);
        curl_easy_cleanup(j->easy);
    }
    curl_slist_free_all(j->hdr);
    free(j->body);
    free(j->resp);
    free(j);
}

void kvs_client_free(kvs_client *c) {
    if (!c) return;
    job *j = c->head;
    while (j) {
        job *n = j->next;
        job_free(c, j);
        j = n;
    }
    if (c->multi) curl_multi_cleanup(c->multi);
    if (c->urls)
        for (int i = 0; i < c->o.n_urls; i++) free(c->urls[i]);
    free(c->urls);
    free(c->in_flight);
    free(c->model);
    free(c);
    curl_global_cleanup();
}

int kvs_client_pending(const kvs_client *c) { return c->n_jobs; }

void kvs_client_result_free(kvs_client_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_outputs; i++) {
        free(r->outputs[i].content);
        free(r->outputs[i].span_kept);
    }
    free(r->outputs);
    r->outputs = NULL;
    r->n_outputs = 0;
}

/* ---- request bodies ------------------------------------------------------ */

/* Occurrences of KVS_CLIENT_MEDIA_MARKER in s (NULL: 0). */
static int count_markers(const char *s) {
    int n = 0;
    const size_t ml = strlen(KVS_CLIENT_MEDIA_MARKER);
    for (const char *p = s ? strstr(s, KVS_CLIENT_MEDIA_MARKER) : NULL; p; p = strstr(p + ml, KVS_CLIENT_MEDIA_MARKER))
        n++;
    return n;
}

/* "multimodal_data": one base64 string per image. The strings are owned by
 * b64[] (cJSON references them: no copy before the body is printed). */
static kvs_status add_media(cJSON *root, const kvs_client_request *r, char **b64, kvs_err *err) {
    cJSON *arr = cJSON_AddArrayToObject(root, "multimodal_data");
    if (!arr) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory building a request body");
    for (int i = 0; i < r->n_media; i++) {
        const kvs_client_media *m = &r->media[i];
        if (!m->data || m->n == 0 || m->n > KVS_CLIENT_MEDIA_MAX_BYTES)
            return kvs_errorf(err, KVS_ERR_INVALID, "client: media[%d] has %zu bytes (1 .. %zu MiB allowed)", i,
                              m->data ? m->n : 0, KVS_CLIENT_MEDIA_MAX_BYTES >> 20);
        size_t out_n = 4 * ((m->n + 2) / 3) + 1;
        b64[i] = malloc(out_n);
        if (!b64[i]) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory encoding media[%d] (%zu bytes)", i, m->n);
        int w = EVP_EncodeBlock((unsigned char *)b64[i], m->data, (int)m->n);
        if (w < 0 || (size_t)w + 1 != out_n)
            return kvs_errorf(err, KVS_ERR_INTERNAL, "client: base64 of media[%d] came out %d bytes, not %zu", i,
                              w, out_n - 1);
        cJSON *str = cJSON_CreateStringReference(b64[i]);
        if (!str || !cJSON_AddItemToArray(arr, str)) {
            cJSON_Delete(str);
            return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory building a request body");
        }
    }
    return KVS_OK;
}

static kvs_status build_body(const kvs_client *c, const kvs_client_request *r, char **out,
                             kvs_err *err) {
    *out = NULL;
    kvs_status rc = KVS_OK;
    char **b64 = NULL; /* [n_media] base64 strings referenced by the tree */
    cJSON *root = cJSON_CreateObject();
    if (!root) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    if (c->model) cJSON_AddStringToObject(root, "model", c->model);
    cJSON_AddStringToObject(root, "prompt", r->prompt);
    cJSON_AddNumberToObject(root, "max_tokens", r->max_tokens);
    cJSON_AddNumberToObject(root, "temperature", 0);
    if (r->ignore_eos) cJSON_AddBoolToObject(root, "ignore_eos", 1);
    if (r->n_stop > 0) {
        cJSON *st = cJSON_AddArrayToObject(root, "stop");
        for (int i = 0; i < r->n_stop; i++) cJSON_AddItemToArray(st, cJSON_CreateString(r->stop[i]));
    }
    if (r->n_spans > 64) {
        rc = kvs_errorf(err, KVS_ERR_INVALID, "client: %d kv_spans; the server takes at most 64", r->n_spans);
        goto done;
    }
    if (c->o.api == KVS_API_KVSIEVE && r->n_spans > 0) {
        cJSON *sp = cJSON_AddArrayToObject(root, "kv_spans");
        for (int i = 0; i < r->n_spans; i++) {
            if (r->spans[2 * i] < 0 || r->spans[2 * i + 1] < r->spans[2 * i]) {
                rc = kvs_errorf(err, KVS_ERR_INVALID, "client: kv_spans[%d] = [%lld, %lld) is not a range", i,
                                (long long)r->spans[2 * i], (long long)r->spans[2 * i + 1]);
                goto done;
            }
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(sp, o);
            cJSON_AddNumberToObject(o, "start", (double)r->spans[2 * i]);
            cJSON_AddNumberToObject(o, "end", (double)r->spans[2 * i + 1]);
        }
    }
    if (c->o.api == KVS_API_KVSIEVE) {
        cJSON *kc = cJSON_AddObjectToObject(root, "kv_compression");
        cJSON *vs = cJSON_AddArrayToObject(kc, "variants");
        for (int i = 0; i < r->n_variants; i++) {
            const kvs_client_variant *v = &r->variants[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(vs, o);
            char name[16];
            snprintf(name, sizeof name, "v%d", i);
            cJSON_AddStringToObject(o, "name", name);
            cJSON_AddStringToObject(o, "method", v->method);
            if (v->tokens > 0)
                cJSON_AddNumberToObject(o, "tokens", (double)v->tokens);
            else if (strcmp(v->method, "full") != 0)
                cJSON_AddNumberToObject(o, "ratio", v->ratio);
            if (v->params_json && v->params_json[0]) {
                cJSON *p = cJSON_Parse(v->params_json);
                if (!p || !cJSON_IsObject(p)) {
                    cJSON_Delete(p);
                    rc = kvs_errorf(err, KVS_ERR_INVALID,
                                    "client: variants[%d].params is not a JSON object: %.200s", i,
                                    v->params_json);
                    goto done;
                }
                cJSON_AddItemToObject(o, "params", p);
            }
            if (r->suffix) cJSON_AddStringToObject(o, "suffix", r->suffix);
            if (r->suffix && v->compress_suffix) cJSON_AddBoolToObject(o, "compress_suffix", 1);
        }
    }
    if (r->n_media > 0) {
        b64 = calloc((size_t)r->n_media, sizeof *b64);
        if (!b64) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((rc = add_media(root, r, b64, err))) goto done;
    }
    *out = cJSON_PrintUnformatted(root);
    if (!*out) rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory building a request body");
done:
    cJSON_Delete(root);
    for (int i = 0; b64 && i < r->n_media; i++) free(b64[i]);
    free(b64);
    return rc;
}

kvs_status kvs_client_submit(kvs_client *c, const kvs_client_request *r, void *tag, kvs_err *err) {
    if (!r->prompt || r->n_variants < 1 || !r->variants || r->max_tokens < 1)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "client: a request needs a prompt, max_tokens >= 1 and at least one variant");
    if (c->o.api == KVS_API_KVSIEVE && r->n_variants > 4096)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "client: %d variants in one request; the kvsieve server takes at most its --batch "
                          "(64 by default, 4096 at most)",
                          r->n_variants);
    if (c->o.api == KVS_API_OPENAI) {
        if (r->n_variants != 1 || strcmp(r->variants[0].method, "full") != 0)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "method '%s': backend api 'openai' evaluates only method 'full' (a plain "
                              "OpenAI-compatible server has no kv_compression); use a kvsieve backend",
                              r->variants[r->n_variants > 1 && !strcmp(r->variants[0].method, "full")]
                                  .method);
        if (r->suffix)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "query-agnostic mode needs the kvsieve kv_compression extension; backend "
                              "api 'openai' cannot append text after a compression");
        if (r->n_media > 0)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "a request with %d image%s: backend api 'openai' sends text only; use a "
                              "multimodal kvsieve backend (kvsieve-hf)",
                              r->n_media, r->n_media == 1 ? "" : "s");
    }
    if (r->n_media < 0 || (r->n_media > 0 && !r->media))
        return kvs_errorf(err, KVS_ERR_INVALID, "client: n_media = %d without media", r->n_media);
    if (r->n_media > 0) {
        int nm = count_markers(r->prompt);
        if (nm != r->n_media)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "client: the prompt has %d '%s' marker%s for %d image%s (multimodal_data); "
                              "each image needs exactly one marker",
                              nm, KVS_CLIENT_MEDIA_MARKER, nm == 1 ? "" : "s", r->n_media,
                              r->n_media == 1 ? "" : "s");
        if (count_markers(r->suffix) > 0)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "client: the suffix has a '%s' marker: images go in the prompt (prefilled "
                              "before the compression), never in the suffix",
                              KVS_CLIENT_MEDIA_MARKER);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    kvs_status rc = build_body(c, r, &j->body, err);
    if (rc) {
        free(j);
        return rc;
    }
    j->tag = tag;
    j->n_variants = r->n_variants;
    j->n_spans = c->o.api == KVS_API_KVSIEVE ? r->n_spans : 0;
    j->t_submit = kvs_now_ms();
    /* new requests go to the least loaded URL, counting queued ones */
    int best = 0, best_n = -1;
    for (int u = 0; u < c->o.n_urls; u++) {
        int n = 0;
        for (job *q = c->head; q; q = q->next) n += q->pref_url == u;
        if (best_n < 0 || n < best_n) best = u, best_n = n;
    }
    j->pref_url = best;
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    c->n_jobs++;
    return KVS_OK;
}

/* ---- transfers ------------------------------------------------------------ */

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    job *j = ud;
    size_t n = size * nmemb;
    if (j->resp_len + n + 1 > MAX_ANSWER) {
        j->too_big = 1;
        return 0;
    }
    if (j->resp_len + n + 1 > j->resp_cap) {
        size_t cap = j->resp_cap ? j->resp_cap : 4096;
        while (cap < j->resp_len + n + 1) cap *= 2;
        char *p = realloc(j->resp, cap);
        if (!p) return 0;
        j->resp = p;
        j->resp_cap = cap;
    }
    memcpy(j->resp + j->resp_len, ptr, n);
    j->resp_len += n;
    j->resp[j->resp_len] = '\0';
    return n;
}

static kvs_status start_job(kvs_client *c, job *j, int url, kvs_err *err) {
    char full[1100];
    snprintf(full, sizeof full, "%s/v1/completions", c->urls[url]);
    if (!j->easy && !(j->easy = curl_easy_init()))
        return kvs_errorf(err, KVS_ERR_INTERNAL, "client: curl_easy_init failed");
    if (!j->hdr) {
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        struct curl_slist *h2 = h ? curl_slist_append(h, "Expect:") : NULL;
        if (!h2) {
            curl_slist_free_all(h);
            return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        }
        j->hdr = h2;
    }
    CURL *e = j->easy;
    curl_easy_reset(e);
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, j->body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, j->hdr);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(e, CURLOPT_PRIVATE, j);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, j->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(c->o.connect_timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(c->o.timeout_s * 1000));
    j->errbuf[0] = '\0';
    j->resp_len = 0;
    j->too_big = 0;
    if (j->resp) j->resp[0] = '\0';
    CURLMcode mc = curl_multi_add_handle(c->multi, e);
    if (mc != CURLM_OK)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "client: curl_multi_add_handle: %s",
                          curl_multi_strerror(mc));
    j->running = 1;
    j->url = url;
    j->attempts++;
    c->in_flight[url]++;
    return KVS_OK;
}

/* Start queued jobs whose time has come, while some URL has room.
 * *next_ms receives the earliest not_before of a waiting job (or -1). */
static kvs_status start_ready(kvs_client *c, double now, double *next_ms, kvs_err *err) {
    *next_ms = -1;
    for (job *j = c->head; j; j = j->next) {
        if (j->running) continue;
        if (j->not_before > now) {
            if (*next_ms < 0 || j->not_before < *next_ms) *next_ms = j->not_before;
            continue;
        }
        int url = -1;
        for (int k = 0; k < c->o.n_urls; k++) {
            int u = (j->pref_url + k) % c->o.n_urls;
            if (c->in_flight[u] < c->o.per_url && (url < 0 || c->in_flight[u] < c->in_flight[url]))
                url = u;
        }
        if (url < 0) break; /* every URL is busy: keep submission order */
        kvs_status rc = start_job(c, j, url, err);
        if (rc) return rc;
    }
    return KVS_OK;
}

/* ---- answers ------------------------------------------------------------- */

static double num_or(const cJSON *o, const char *k, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static void fill_timings(kvs_client_output *out, const cJSON *t) {
    if (!cJSON_IsObject(t)) return;
    out->prompt_n = (int64_t)num_or(t, "prompt_n", (double)out->prompt_n);
    out->prompt_ms = num_or(t, "prompt_ms", out->prompt_ms);
    out->predicted_ms = num_or(t, "predicted_ms", out->predicted_ms);
    out->predicted_per_second = num_or(t, "predicted_per_second", out->predicted_per_second);
    out->compress_ms = num_or(t, "compress_ms", out->compress_ms);
    out->predicted_n = (int64_t)num_or(t, "predicted_n", (double)out->predicted_n);
}

static void output_init(kvs_client_output *o) {
    memset(o, 0, sizeof *o);
    o->prompt_n = -1;
    o->prompt_ms = o->compress_ms = o->predicted_ms = o->predicted_per_second = NAN;
    o->bytes_before = o->bytes_after = o->tokens_before = o->tokens_after = -1;
}

static int set_content(kvs_client_output *o, const cJSON *s) {
    o->content = dup_str(cJSON_IsString(s) ? s->valuestring : "");
    return o->content ? 0 : -1;
}

/* kv.span_kept: n_spans arrays of one number in [0, 1] per layer, all as
 * long. 0 ok, -1 malformed, -2 out of memory. */
static int parse_span_kept(const cJSON *sk, int n_spans, kvs_client_output *o) {
    if (!cJSON_IsArray(sk) || cJSON_GetArraySize(sk) != n_spans) return -1;
    int L = cJSON_GetArraySize(cJSON_GetArrayItem(sk, 0));
    if (L < 1) return -1;
    o->span_kept = malloc(sizeof *o->span_kept * (size_t)n_spans * (size_t)L);
    if (!o->span_kept) return -2;
    const cJSON *row;
    int s = 0;
    cJSON_ArrayForEach(row, sk) {
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != L) goto bad;
        const cJSON *x;
        int l = 0;
        cJSON_ArrayForEach(x, row) {
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0.0 && x->valuedouble <= 1.0)) goto bad;
            o->span_kept[(size_t)s * (size_t)L + (size_t)l++] = x->valuedouble;
        }
        s++;
    }
    o->span_n = n_spans;
    o->span_layers = L;
    return 0;
bad:
    free(o->span_kept);
    o->span_kept = NULL;
    return -1;
}

/* Parse a 2xx answer into r->outputs; on failure fill r->error. */
static void parse_answer(const kvs_client *c, const job *j, kvs_client_result *r) {
    const char *url = c->urls[j->url];
    cJSON *root = cJSON_ParseWithLength(j->resp ? j->resp : "", j->resp_len);
    if (!cJSON_IsObject(root)) {
        r->status = KVS_ERR_FORMAT;
        snprintf(r->error, sizeof r->error, "%s/v1/completions answered HTTP %ld with a body that is not "
                 "a JSON object: %.200s", url, r->http_status, j->resp ? j->resp : "");
        cJSON_Delete(root);
        return;
    }
    r->outputs = calloc((size_t)j->n_variants, sizeof *r->outputs);
    if (!r->outputs) {
        r->status = KVS_ERR_NOMEM;
        snprintf(r->error, sizeof r->error, "out of memory");
        cJSON_Delete(root);
        return;
    }
    r->n_outputs = j->n_variants;
    for (int i = 0; i < r->n_outputs; i++) output_init(&r->outputs[i]);
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(root, "variants");
    if (c->o.api == KVS_API_OPENAI) {
        /* plain OpenAI completion: one choice, usage, and timings when given */
        kvs_client_output *o = &r->outputs[0];
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
        if (!cJSON_IsObject(ch)) {
            r->status = KVS_ERR_FORMAT;
            snprintf(r->error, sizeof r->error, "%s/v1/completions: the answer has no choices[0]", url);
            goto done;
        }
        if (set_content(o, cJSON_GetObjectItemCaseSensitive(ch, "text"))) goto nomem;
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
        o->prompt_n = (int64_t)num_or(u, "prompt_tokens", -1);
        o->predicted_n = (int64_t)num_or(u, "completion_tokens", 0);
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
        snprintf(o->stop_type, sizeof o->stop_type, "%s", cJSON_IsString(fr) ? fr->valuestring : "");
        fill_timings(o, cJSON_GetObjectItemCaseSensitive(root, "timings"));
        goto done;
    }
    if (!cJSON_IsArray(vs)) {
        r->status = KVS_ERR_UNSUPPORTED;
        snprintf(r->error, sizeof r->error,
                 "%s ignored kv_compression (its answer has no 'variants'): it is not a kvsieve "
                 "backend; an OpenAI-compatible server can only evaluate method 'full' "
                 "(backend.api = \"openai\")", url);
        goto done;
    }
    if (cJSON_GetArraySize(vs) != j->n_variants) {
        r->status = KVS_ERR_FORMAT;
        snprintf(r->error, sizeof r->error, "%s answered %d variants for the %d sent", url,
                 cJSON_GetArraySize(vs), j->n_variants);
        goto done;
    }
    for (int i = 0; i < j->n_variants; i++) {
        const cJSON *v = cJSON_GetArrayItem(vs, i);
        kvs_client_output *o = &r->outputs[i];
        if (!cJSON_IsObject(v)) {
            r->status = KVS_ERR_FORMAT;
            snprintf(r->error, sizeof r->error, "%s: variants[%d] is not an object", url, i);
            goto done;
        }
        if (set_content(o, cJSON_GetObjectItemCaseSensitive(v, "content"))) goto nomem;
        o->predicted_n = (int64_t)num_or(v, "tokens_predicted", 0);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(v, "stop_type");
        snprintf(o->stop_type, sizeof o->stop_type, "%s", cJSON_IsString(st) ? st->valuestring : "");
        fill_timings(o, cJSON_GetObjectItemCaseSensitive(v, "timings"));
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(v, "kv");
        if (cJSON_IsObject(kv)) {
            o->bytes_before = (int64_t)num_or(kv, "bytes_before", -1);
            o->bytes_after = (int64_t)num_or(kv, "bytes_after", -1);
            o->tokens_before = (int64_t)num_or(kv, "tokens_before", -1);
            o->tokens_after = (int64_t)num_or(kv, "tokens_after", -1);
            const cJSON *note = cJSON_GetObjectItemCaseSensitive(kv, "note");
            if (cJSON_IsString(note)) snprintf(o->note, sizeof o->note, "%s", note->valuestring);
            const cJSON *sk = cJSON_GetObjectItemCaseSensitive(kv, "span_kept");
            if (j->n_spans > 0 && sk && !cJSON_IsNull(sk)) {
                int bad = parse_span_kept(sk, j->n_spans, o);
                if (bad == -2) goto nomem;
                if (bad) {
                    r->status = KVS_ERR_FORMAT;
                    snprintf(r->error, sizeof r->error,
                             "%s: variants[%d].kv.span_kept is not %d arrays of one share in [0, 1] "
                             "per layer (one per kv_spans entry, every array as long)", url, i, j->n_spans);
                    goto done;
                }
            }
        }
    }
done:
    cJSON_Delete(root);
    if (r->status) kvs_client_result_free(r);
    return;
nomem:
    r->status = KVS_ERR_NOMEM;
    snprintf(r->error, sizeof r->error, "out of memory");
    goto done;
}

/* The server's error message of a non-2xx answer, verbatim when it is the
 * {"error": {"message"}} shape (kvsieve, OpenAI, llama-server), else the
 * body's beginning. */
static void answer_error(const job *j, char *out, size_t n) {
    cJSON *root = cJSON_ParseWithLength(j->resp ? j->resp : "", j->resp_len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
    if (cJSON_IsString(m))
        snprintf(out, n, "%s", m->valuestring);
    else
        snprintf(out, n, "%.300s", j->resp_len ? j->resp : "(empty body)");
    cJSON_Delete(root);
}

static int retryable_curl(CURLcode cc) {
    switch (cc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return 1;
    default:
        return 0;
    }
}

/* A transfer ended. Returns 1 when the job is finished (result filled),
 * 0 when it was re-queued for a retry. */
static int finish_transfer(kvs_client *c, job *j, CURLcode cc, kvs_client_result *r) {
    memset(r, 0, sizeof *r);
    curl_multi_remove_handle(c->multi, j->easy);
    j->running = 0;
    c->in_flight[j->url]--;
    long status = 0;
    curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &status);
    r->http_status = status;
    r->attempts = j->attempts;
    r->url_index = j->url;
    const char *url = c->urls[j->url];
    int retry = 0;
    char why[600] = "";
    if (cc != CURLE_OK) {
        if (cc == CURLE_OPERATION_TIMEDOUT) {
            r->status = KVS_ERR_IO;
            snprintf(r->error, sizeof r->error, "%s/v1/completions timed out after %g s (try %d): %s",
                     url, c->o.timeout_s, j->attempts, j->errbuf[0] ? j->errbuf : curl_easy_strerror(cc));
            return 1;
        }
        if (j->too_big) {
            r->status = KVS_ERR_FORMAT;
            snprintf(r->error, sizeof r->error, "%s: answer larger than %u MiB", url, MAX_ANSWER >> 20);
            return 1;
        }
        retry = retryable_curl(cc);
        snprintf(why, sizeof why, "%s", j->errbuf[0] ? j->errbuf : curl_easy_strerror(cc));
        r->status = KVS_ERR_IO;
    } else if (status >= 500) {
        retry = 1;
        char msg[500];
        answer_error(j, msg, sizeof msg);
        snprintf(why, sizeof why, "HTTP %ld: %s", status, msg);
        r->status = KVS_ERR_IO;
    } else if (status >= 400) {
        char msg[600];
        answer_error(j, msg, sizeof msg);
        r->status = KVS_ERR_INVALID;
        snprintf(r->error, sizeof r->error, "%s refused the request (HTTP %ld, not retried): %s", url,
                 status, msg);
        return 1;
    } else if (status < 200 || status >= 300) {
        r->status = KVS_ERR_FORMAT;
        snprintf(r->error, sizeof r->error, "%s/v1/completions: unexpected HTTP %ld", url, status);
        return 1;
    } else {
        parse_answer(c, j, r);
        return 1;
    }
    if (retry && j->attempts < c->o.max_attempts) {
        double d = c->o.backoff_ms;
        for (int k = 1; k < j->attempts && d < MAX_BACKOFF_MS; k++) d *= 2;
        if (d > MAX_BACKOFF_MS) d = MAX_BACKOFF_MS;
        j->not_before = kvs_now_ms() + d;
        j->pref_url = (j->url + 1) % c->o.n_urls;
        return 0;
    }
    snprintf(r->error, sizeof r->error, "%s/v1/completions failed after %d tr%s: %s%s", url,
             j->attempts, j->attempts == 1 ? "y" : "ies", why,
             cc == CURLE_COULDNT_CONNECT ? " (is the backend running?)" : "");
    return 1;
}

static void unlink_job(kvs_client *c, job *j) {
    job **pp = &c->head;
    job *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    assert(*pp == j);
    *pp = j->next;
    if (c->tail == j) c->tail = prev;
    c->n_jobs--;
}

kvs_status kvs_client_poll(kvs_client *c, int wait_ms, kvs_client_done_fn done, void *ctx,
                           int *n_pending, kvs_err *err) {
    kvs_status rc = KVS_OK;
    double t_end = kvs_now_ms() + (wait_ms > 0 ? wait_ms : 0);
    int finished_any = 0;
    for (;;) {
        double now = kvs_now_ms(), next = -1;
        if ((rc = start_ready(c, now, &next, err))) break;
        int still = 0;
        CURLMcode mc = curl_multi_perform(c->multi, &still);
        if (mc != CURLM_OK) {
            rc = kvs_errorf(err, KVS_ERR_INTERNAL, "client: curl_multi_perform: %s",
                            curl_multi_strerror(mc));
            break;
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(c->multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            job *j = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            assert(j && j->easy == msg->easy_handle);
            kvs_client_result r;
            if (finish_transfer(c, j, msg->data.result, &r)) {
                r.elapsed_ms = kvs_now_ms() - j->t_submit;
                unlink_job(c, j);
                if (done) done(ctx, j->tag, &r);
                kvs_client_result_free(&r);
                job_free(c, j);
                finished_any = 1;
            }
        }
        now = kvs_now_ms();
        if (c->n_jobs == 0 || now >= t_end || finished_any) break;
        double w = t_end - now;
        if (next >= 0 && next - now < w) w = next - now;
        if (w < 1) w = 1;
        int nfds = 0;
        mc = curl_multi_poll(c->multi, NULL, 0, (int)w, &nfds);
        if (mc != CURLM_OK) {
            rc = kvs_errorf(err, KVS_ERR_INTERNAL, "client: curl_multi_poll: %s",
                            curl_multi_strerror(mc));
            break;
        }
    }
    if (n_pending) *n_pending = c->n_jobs;
    return rc;
}

kvs_status kvs_http_get(const char *url, const char *path, double timeout_s, long *status,
                        char **body, kvs_err *err) {
    *status = 0;
    if (body) *body = NULL;
    job j;
    memset(&j, 0, sizeof j);
    char full[1200];
    snprintf(full, sizeof full, "%s%s", url, path);
    CURL *e = curl_easy_init();
    if (!e) return kvs_errorf(err, KVS_ERR_INTERNAL, "curl_easy_init failed");
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &j);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, j.errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode cc = curl_easy_perform(e);
    kvs_status rc = KVS_OK;
    if (cc != CURLE_OK) {
        rc = kvs_errorf(err, KVS_ERR_IO, "GET %s: %s", full, j.errbuf[0] ? j.errbuf : curl_easy_strerror(cc));
    } else {
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
        if (body) {
            *body = j.resp ? j.resp : dup_str("");
            j.resp = NULL;
        }
    }
    free(j.resp);
    curl_easy_cleanup(e);
    return rc;
}

kvs_status kvs_http_count_tokens(const char *url, const char *text, size_t n, double timeout_s,
                                 int64_t *n_tokens, kvs_err *err) {
    *n_tokens = -1;
    char *body = NULL;
    {
        /* {"content": text, "add_special": true}: the count of a prompt */
        char *t = malloc(n + 1);
        if (!t) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        memcpy(t, text, n);
        t[n] = '\0';
        cJSON *root = cJSON_CreateObject();
        if (root) {
            cJSON_AddStringToObject(root, "content", t);
            cJSON_AddBoolToObject(root, "add_special", 1);
            body = cJSON_PrintUnformatted(root);
            cJSON_Delete(root);
        }
        free(t);
        if (!body) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    }
    job j;
    memset(&j, 0, sizeof j);
    char full[1200];
    snprintf(full, sizeof full, "%s/tokenize", url);
    CURL *e = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    kvs_status rc = KVS_OK;
    if (!e || !h) {
        rc = kvs_errorf(err, KVS_ERR_INTERNAL, "curl_easy_init failed");
        goto done;
    }
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &j);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, j.errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode cc = curl_easy_perform(e);
    if (cc != CURLE_OK) {
        rc = kvs_errorf(err, KVS_ERR_IO, "POST %s: %s", full, j.errbuf[0] ? j.errbuf : curl_easy_strerror(cc));
        goto done;
    }
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    cJSON *root = cJSON_ParseWithLength(j.resp ? j.resp : "", j.resp_len);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (status != 200 || !cJSON_IsArray(toks)) {
        char msg[400];
        answer_error(&j, msg, sizeof msg);
        rc = kvs_errorf(err, status >= 400 && status < 500 ? KVS_ERR_INVALID : KVS_ERR_FORMAT,
                        "POST %s: HTTP %ld without a tokens array: %s", full, status, msg);
    } else {
        *n_tokens = cJSON_GetArraySize(toks);
    }
    cJSON_Delete(root);
done:
    curl_slist_free_all(h);
    if (e) curl_easy_cleanup(e);
    free(j.resp);
    free(body);
    return rc;
}
