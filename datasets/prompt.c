/*
 * prompt.c -- kvsieve_datasets: built-in versioned prompt templates, their
 * hash, the two prompt modes and rendering a sample into the part to
 * compress and the part appended after compression.
 * Not here: chat templates or special tokens (the backend applies the
 * model's chat format), tokenization.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_internal.h"

static const kvs_prompt_template builtin[] = {
    {"needle", "1",
     "Below is a long text. One sentence in it holds a fact that you will be asked about.\n\n"
     "{context}\n\n",
     "Answer the question using the text above. Give only the answer, in a few words.\n"
     "Question: {question}\nAnswer:"},
    {"qa", "1", "Read the following document.\n\n{context}\n\n",
     "Answer the question based on the document. Be brief: answer with a short phrase.\n"
     "Question: {question}\nAnswer:"},
    {"choice", "1", "Read the following document.\n\n{context}\n\n",
     "Question: {question}\n{choices}Answer with the letter of the correct option.\nAnswer:"},
    {"milebench", "1", "{context}\n\n", "{question}\n{choices}Answer:"},
    {"ruler", "1", "{context}", "{question}"},
};
enum { N_BUILTIN = (int)(sizeof builtin / sizeof builtin[0]) };

const char *kvs_prompt_mode_name(kvs_prompt_mode m) {
    return m == KVS_PROMPT_QUERY_AGNOSTIC ? "query_agnostic" : "query_aware";
}

kvs_status kvs_prompt_mode_parse(const char *s, kvs_prompt_mode *m, kvs_err *err) {
    static const char *const names[] = {"query_aware", "query_agnostic"};
    if (s && !strcmp(s, names[0])) *m = KVS_PROMPT_QUERY_AWARE;
    else if (s && !strcmp(s, names[1])) *m = KVS_PROMPT_QUERY_AGNOSTIC;
    else
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "prompt mode '%s' is not one of query_aware, query_agnostic (did you mean '%s'?)",
                          s ? s : "(null)", kvs_ds_closest(s ? s : "", names, 2));
    return KVS_OK;
}

kvs_status kvs_prompt_template_get(const char *name, const kvs_prompt_template **out,
                                   kvs_err *err) {
    const char *names[N_BUILTIN];
    for (int i = 0; i < N_BUILTIN; i++) {
        names[i] = builtin[i].name;
        if (name && !strcmp(name, builtin[i].name)) {
            *out = &builtin[i];
            return KVS_OK;
        }
    }
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "unknown prompt template '%s' (did you mean '%s'?); templates: needle, qa, "
                      "choice, milebench, ruler",
                      name ? name : "(null)", kvs_ds_closest(name ? name : "", names, N_BUILTIN));
}

kvs_status kvs_prompt_template_hash(const kvs_prompt_template *t, kvs_ds_hash_fn hash,
                                    char out[65], kvs_err *err) {
    if (!t || !t->name || !t->version || !t->context_part || !t->question_part)
        return kvs_errorf(err, KVS_ERR_INVALID, "prompt template '%s': a part is missing",
                          t && t->name ? t->name : "?");
    if (!hash) return kvs_errorf(err, KVS_ERR_INVALID, "prompt template '%s': no hash function", t->name);
    kvs_ds_buf b = {0};
    kvs_status st = kvs_ds_buf_add(&b, t->name, strlen(t->name) + 1, err);
    if (!st) st = kvs_ds_buf_add(&b, t->version, strlen(t->version) + 1, err);
    if (!st) st = kvs_ds_buf_add(&b, t->context_part, strlen(t->context_part) + 1, err);
    if (!st) st = kvs_ds_buf_add(&b, t->question_part, strlen(t->question_part), err);
    if (!st) hash(b.p, b.n, out);
    kvs_ds_buf_free(&b);
    return st;
}

static kvs_status render_part(const kvs_prompt_template *t, const char *part, const char *which,
                              const kvs_sample *s, kvs_ds_buf *b, kvs_err *err) {
    kvs_status st = KVS_OK;
    for (const char *p = part; !st && *p;) {
        if (p[0] == '{' && p[1] == '{') {
            st = kvs_ds_buf_add(b, "{", 1, err);
            p += 2;
        } else if (p[0] == '}' && p[1] == '}') {
            st = kvs_ds_buf_add(b, "}", 1, err);
            p += 2;
        } else if (p[0] == '{') {
            const char *e = strchr(p, '}');
            if (!e)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "prompt template '%s' %s: unclosed '{' at offset %ld", t->name,
                                  which, (long)(p - part));
            size_t n = (size_t)(e - p - 1);
            if (n == 7 && !strncmp(p + 1, "context", 7)) {
                st = kvs_ds_buf_adds(b, s->context ? s->context : "", err);
            } else if (n == 8 && !strncmp(p + 1, "question", 8)) {
                st = kvs_ds_buf_adds(b, s->question ? s->question : "", err);
            } else if (n == 7 && !strncmp(p + 1, "choices", 7)) {
                if (s->n_choices > 26)
                    return kvs_errorf(err, KVS_ERR_INVALID, "sample '%s': %d choices (at most 26)",
                                      s->id ? s->id : "?", s->n_choices);
                for (int i = 0; !st && i < s->n_choices; i++)
                    st = kvs_ds_buf_addf(b, err, "%c. %s\n", 'A' + i, s->choices[i]);
            } else {
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "prompt template '%s' %s: unknown placeholder '{%.*s}' "
                                  "(placeholders: {context}, {question}, {choices}; '{{' for a brace)",
                                  t->name, which, (int)(n > 40 ? 40 : n), p + 1);
            }
            p = e + 1;
        } else {
            const char *q = p + 1;
            while (*q && *q != '{' && !(q[0] == '}' && q[1] == '}')) q++;
            st = kvs_ds_buf_add(b, p, (size_t)(q - p), err);
            p = q;
        }
    }
    return st;
}

kvs_status kvs_prompt_render(const kvs_prompt_template *t, const kvs_sample *s,
                             kvs_prompt_mode mode, char **compress, char **append, kvs_err *err) {
    kvs_ds_buf a = {0}, q = {0};
    kvs_status st = KVS_OK;
    *compress = *append = NULL;
    if (!t || !t->name || !t->context_part || !t->question_part)
        return kvs_errorf(err, KVS_ERR_INVALID, "prompt template: a part is missing");
    st = render_part(t, t->context_part, "context_part", s, &a, err);
    if (st) goto cleanup;
    st = render_part(t, t->question_part, "question_part", s, mode == KVS_PROMPT_QUERY_AWARE ? &a : &q, err);
    if (st) goto cleanup;
    *compress = kvs_ds_buf_take(&a, err);
    *append = *compress ? kvs_ds_buf_take(&q, err) : NULL;
    if (!*compress || !*append) {
        free(*compress);
        *compress = NULL;
        st = err ? err->code : KVS_ERR_NOMEM;
    }
cleanup:
    kvs_ds_buf_free(&a);
    kvs_ds_buf_free(&q);
    return st;
}

int64_t kvs_prompt_context_offset(const kvs_prompt_template *t, const kvs_sample *s) {
    if (!t || !t->context_part) return -1;
    const char *at = NULL;
    for (const char *p = t->context_part; *p; p++) {
        if (p[0] == '{' && p[1] == '{') {
            p++;
            continue;
        }
        if (!strncmp(p, "{context}", 9)) {
            at = p;
            break;
        }
    }
    if (!at) return -1;
    size_t n = (size_t)(at - t->context_part);
    char *head = malloc(n + 1);
    if (!head) return -1;
    memcpy(head, t->context_part, n);
    head[n] = '\0';
    kvs_ds_buf b = {0};
    kvs_err e = {0};
    int64_t off = render_part(t, head, "context_part", s, &b, &e) ? -1 : (int64_t)b.n;
    kvs_ds_buf_free(&b);
    free(head);
    return off;
}
