/*
 * http_client.c -- the server tests' libcurl client (http_client.h): one easy
 * handle per call, the body and the Retry-After header collected in a tc_reply;
 * and the server fixture (tc_fixture).
 * Not a general client (see the header).
 */
#include "server/http_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    tc_reply *r = ud;
    size_t k = sz * n;
    char *nb = realloc(r->body, r->len + k + 1);
    if (!nb) return 0; /* curl fails the call: status 0 */
    memcpy(nb + r->len, p, k);
    r->body = nb;
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    tc_reply *r = ud;
    size_t k = sz * n;
    if (k > 12 && strncasecmp(p, "Retry-After:", 12) == 0) {
        size_t m = k - 12 < sizeof r->retry_after - 1 ? k - 12 : sizeof r->retry_after - 1;
        memcpy(r->retry_after, p + 12, m);
        r->retry_after[m] = 0;
    }
    return k;
}

long tc_request(const tc_server *s, const char *method, const char *path, const char *json, const char *header,
                tc_reply *r) {
    memset(r, 0, sizeof *r);
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    struct curl_slist *h = NULL;
    if (c) {
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, s->timeout_s);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM: calls run on test threads */
        if (header) h = curl_slist_append(h, header);
        if (json) {
            h = curl_slist_append(h, "Content-Type: application/json");
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(json));
        }
        if (h) curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (!r->body) r->body = calloc(1, 1);
    return r->status;
}

void tc_reply_free(tc_reply *r) {
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

long tc_status(const tc_server *s, const char *method, const char *path, const char *json) {
    tc_reply r;
    long st = tc_request(s, method, path, json, NULL, &r);
    tc_reply_free(&r);
    return st;
}

cJSON *tc_call(const tc_server *s, const char *method, const char *path, const char *json, const char *header,
               long *status) {
    tc_reply a;
    *status = tc_request(s, method, path, json, header, &a);
    cJSON *j = a.body ? cJSON_Parse(a.body) : NULL;
    if (!j || (s->log_non_200 && a.status != 200))
        fprintf(stderr, "%s %s -> %ld%s: %.400s\n", method, path, a.status, j ? "" : ", not JSON",
                a.body ? a.body : "");
    tc_reply_free(&a);
    return j;
}

const cJSON *tc_obj(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

double tc_num(const cJSON *o, const char *k) {
    const cJSON *it = tc_obj(o, k);
    return cJSON_IsNumber(it) ? it->valuedouble : NAN;
}

const char *tc_str(const cJSON *o, const char *k) {
    const char *v = tc_str_or_null(o, k);
    return v ? v : "";
}

const char *tc_str_or_null(const cJSON *o, const char *k) {
    const cJSON *it = tc_obj(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

kvs_status tc_fixture_init(tc_fixture *f, const char *tag, const char *arch, kvs_err *err) {
    memset(f, 0, sizeof *f);
    f->spec = tiny_default(arch);
    kvs_server_config_defaults(&f->cfg);
    f->cfg.port = 0;
    f->cfg.threads = 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char dir[sizeof f->dir];
    snprintf(dir, sizeof dir, "/tmp/%s-XXXXXX", tag);
    if (!mkdtemp(dir)) return kvs_errorf(err, KVS_ERR_IO, "mkdtemp %s: %s", dir, strerror(errno));
    memcpy(f->dir, dir, sizeof dir); /* set only once made: tc_fixture_free removes it */
    snprintf(f->path, sizeof f->path, "%s/tiny.gguf", f->dir);
    return tiny_write(&f->spec, f->path, err);
}

kvs_status tc_fixture_load(tc_fixture *f, kvs_err *err) {
    kvs_model_opts mo = {1};
    return kvs_model_load(f->path, &mo, &f->model, err);
}

kvs_status tc_server_start(tc_fixture *f, tc_server *s, kvs_err *err) {
    kvs_status st = kvs_server_start(f->model, &f->cfg, &f->srv, err);
    if (f->srv) s->port = kvs_server_port(f->srv);
    return st;
}

void tc_server_stop(tc_fixture *f) {
    kvs_server_stop(f->srv);
    f->srv = NULL;
}

void tc_fixture_free(tc_fixture *f) {
    tc_server_stop(f);
    kvs_model_free(f->model);
    f->model = NULL;
    if (f->dir[0]) {
        unlink(f->path);
        rmdir(f->dir);
    }
    curl_global_cleanup();
}
