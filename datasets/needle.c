/*
 * needle.c -- kvsieve_datasets: the needle-in-a-haystack / passkey generator
 * and the haystack builder over the shipped original prose
 * (data/haystack.txt, compiled in as kvs_ds_haystack_text).
 * Not here: tokenization (lengths are in characters; the backend counts the
 * real tokens), scoring (eval/metrics.c). Deterministic: no clock, no global
 * random state; every draw comes from a splitmix64 stream seeded per sample.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_internal.h"

/* Generated at configure time from data/haystack.txt (haystack_data.c). */
extern const char kvs_ds_haystack_text[];
extern const size_t kvs_ds_haystack_len;

const char *kvs_haystack_default(size_t *len) {
    if (len) *len = kvs_ds_haystack_len;
    return kvs_ds_haystack_text;
}

int64_t kvs_tokens_to_chars(int64_t tokens) { return (int64_t)llround((double)tokens * KVS_CHARS_PER_TOKEN); }

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The source split into sentences: lines starting with '#' dropped
 * (headings), whitespace runs collapsed to one space,
 * a sentence ends after '.', '!' or '?' (plus closing quotes/brackets) that is
 * followed by whitespace or the end. */
typedef struct {
    char *text;       /* [len+1] normalised source */
    size_t len;
    size_t *start;    /* [n] */
    size_t *slen;     /* [n] */
    int n;
    size_t longest;
} sentences;

static void sentences_free(sentences *s) {
    free(s->text);
    free(s->start);
    free(s->slen);
    memset(s, 0, sizeof *s);
}

static kvs_status sentences_split(const char *src, size_t n, sentences *out, kvs_err *err) {
    memset(out, 0, sizeof *out);
    out->text = malloc(n + 1);
    if (!out->text) return kvs_errorf(err, KVS_ERR_NOMEM, "haystack: out of memory (%zu bytes)", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '#' && (i == 0 || src[i - 1] == '\n')) { /* a heading line: skip it */
            while (i < n && src[i] != '\n') i++;
            if (m > 0 && out->text[m - 1] != ' ') out->text[m++] = ' ';
            continue;
        }
        if (is_space(c)) {
            if (m > 0 && out->text[m - 1] != ' ') out->text[m++] = ' ';
        } else {
            out->text[m++] = c;
        }
    }
    while (m > 0 && out->text[m - 1] == ' ') m--;
    out->text[m] = '\0';
    out->len = m;
    size_t cap = m / 16 + 2;
    out->start = malloc(cap * sizeof *out->start);
    out->slen = malloc(cap * sizeof *out->slen);
    if (!out->start || !out->slen) {
        sentences_free(out);
        return kvs_errorf(err, KVS_ERR_NOMEM, "haystack: out of memory (sentence index)");
    }
    size_t st = 0;
    for (size_t i = 0; i < m; i++) {
        char c = out->text[i];
        if (c != '.' && c != '!' && c != '?') continue;
        size_t e = i + 1;
        while (e < m && (out->text[e] == '"' || out->text[e] == '\'' || out->text[e] == ')')) e++;
        if (e < m && out->text[e] != ' ') continue;
        if ((size_t)out->n == cap) {
            cap *= 2;
            size_t *a = realloc(out->start, cap * sizeof *a);
            if (a) out->start = a;
            size_t *b = a ? realloc(out->slen, cap * sizeof *b) : NULL;
            if (!a || !b) {
                sentences_free(out);
                return kvs_errorf(err, KVS_ERR_NOMEM, "haystack: out of memory (sentence index)");
            }
            out->slen = b;
        }
        out->start[out->n] = st;
        out->slen[out->n] = e - st;
        if (e - st > out->longest) out->longest = e - st;
        out->n++;
        st = e + 1;
        i = e;
    }
    if (out->n < 2) {
        sentences_free(out);
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "haystack: the source text has fewer than 2 sentences ending in '.', '!' or '?'");
    }
    return KVS_OK;
}

/* Sentences from a seed-chosen one, in order, wrapping, joined by one space,
 * while the total stays <= target. starts (optional) receives the offset of
 * each sentence in the output, [*n_starts]. */
static kvs_status build(const sentences *s, int64_t target, uint64_t seed, kvs_ds_buf *out,
                        size_t **starts, int *n_starts, kvs_err *err) {
    uint64_t rng = seed ^ 0x6861797374616B00ull; /* "haystak" */
    int k = (int)(kvs_rng_next(&rng) % (uint64_t)s->n);
    size_t cap = 0;
    kvs_status st = KVS_OK;
    if (starts) {
        *starts = NULL;
        *n_starts = 0;
    }
    for (;;) {
        size_t add = s->slen[k] + (out->n ? 1 : 0);
        if ((int64_t)(out->n + add) > target) break;
        if (out->n) st = kvs_ds_buf_add(out, " ", 1, err);
        if (!st && starts) {
            if ((size_t)*n_starts == cap) {
                cap = cap ? cap * 2 : 64;
                size_t *p = realloc(*starts, cap * sizeof *p);
                if (!p) {
                    st = kvs_errorf(err, KVS_ERR_NOMEM, "haystack: out of memory");
                    break;
                }
                *starts = p;
            }
            (*starts)[(*n_starts)++] = out->n;
        }
        if (!st) st = kvs_ds_buf_add(out, s->text + s->start[k], s->slen[k], err);
        if (st) break;
        k = (k + 1) % s->n;
    }
    if (!st && !out->p) st = kvs_ds_buf_add(out, "", 0, err);
    return st;
}

kvs_status kvs_haystack_build(const char *source, size_t source_len, int64_t target_chars,
                              uint64_t seed, char **out, size_t *out_len, kvs_err *err) {
    sentences s;
    kvs_ds_buf b = {0};
    *out = NULL;
    if (target_chars < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "haystack: target length %lld is negative",
                          (long long)target_chars);
    kvs_status st = sentences_split(source, source_len, &s, err);
    if (st) return st;
    st = build(&s, target_chars, seed, &b, NULL, NULL, err);
    if (st) goto cleanup;
    *out_len = b.n;
    *out = kvs_ds_buf_take(&b, err);
    if (!*out) st = err ? err->code : KVS_ERR_NOMEM;
cleanup:
    kvs_ds_buf_free(&b);
    sentences_free(&s);
    return st;
}

/* ---- needles --------------------------------------------------------------- */

static const char *const kind_names[] = {"passkey", "city", "number"};
enum { N_KINDS = 3 };

static const char *const people[] = {"Amara", "Bertil", "Chiara", "Dmitri", "Esther", "Farid",
                                     "Greta", "Hamish", "Ingrid", "Jonas", "Keiko", "Lorenzo",
                                     "Maren", "Nikolai", "Odile", "Pavel", "Quentin", "Rosalind",
                                     "Soren", "Tamsin"};
static const char *const cities[] = {"Lisbon", "Valparaiso", "Tbilisi", "Montevideo", "Reykjavik",
                                     "Kyoto", "Ljubljana", "Antwerp", "Cartagena", "Dunedin",
                                     "Tallinn", "Marrakesh", "Winnipeg", "Hobart", "Porto",
                                     "Bratislava", "Trondheim", "Salzburg", "Nagasaki", "Quito"};
static const char *const things[] = {"the blue lighthouse", "the copper kettle",
                                     "the northern orchard", "the silent clocktower",
                                     "the paper boat", "the iron bridge", "the velvet curtain",
                                     "the glass harbor", "the hollow oak", "the amber lantern",
                                     "the stone well", "the winter garden"};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    char sentence[128], question[128], value[32];
    const char *kind;
} needle;

static void make_needle(int kind, uint64_t *rng, needle *n) {
    n->kind = kind_names[kind];
    if (kind == 0) {
        unsigned v = 10000u + (unsigned)(kvs_rng_next(rng) % 90000u);
        snprintf(n->value, sizeof n->value, "%u", v);
        snprintf(n->sentence, sizeof n->sentence, "The secret passkey is %s. Remember it.", n->value);
        snprintf(n->question, sizeof n->question, "What is the secret passkey?");
    } else if (kind == 1) {
        const char *p = people[kvs_rng_next(rng) % (uint64_t)COUNT(people)];
        const char *c = cities[kvs_rng_next(rng) % (uint64_t)COUNT(cities)];
        snprintf(n->value, sizeof n->value, "%s", c);
        snprintf(n->sentence, sizeof n->sentence, "%s moved to the city of %s last spring.", p, c);
        snprintf(n->question, sizeof n->question, "To which city did %s move last spring?", p);
    } else {
        const char *t = things[kvs_rng_next(rng) % (uint64_t)COUNT(things)];
        unsigned v = 1000000u + (unsigned)(kvs_rng_next(rng) % 9000000u);
        snprintf(n->value, sizeof n->value, "%u", v);
        snprintf(n->sentence, sizeof n->sentence, "The special magic number for %s is %s.", t,
                 n->value);
        snprintf(n->question, sizeof n->question, "What is the special magic number for %s?", t);
    }
}

static kvs_status parse_kinds(const char *list, int *on, int *n_on, kvs_err *err) {
    *n_on = 0;
    if (!list || !*list) {
        for (int k = 0; k < N_KINDS; k++) on[(*n_on)++] = k;
        return KVS_OK;
    }
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(e - p), p);
        int found = -1;
        for (int k = 0; k < N_KINDS; k++)
            if (!strcmp(name, kind_names[k])) found = k;
        if (found < 0)
            return kvs_errorf(err, KVS_ERR_NOTFOUND,
                              "needle kinds: unknown kind '%s' (did you mean '%s'?); kinds: passkey, "
                              "city, number",
                              name, kvs_ds_closest(name, kind_names, N_KINDS));
        int dup = 0;
        for (int i = 0; i < *n_on; i++) dup |= on[i] == found;
        if (!dup) on[(*n_on)++] = found;
        p = e;
    }
    if (*n_on == 0) return kvs_errorf(err, KVS_ERR_INVALID, "needle kinds: empty list '%s'", list);
    return KVS_OK;
}

kvs_status kvs_needle_generate(const kvs_needle_opts *o, kvs_ds_hash_fn hash, kvs_dataset **out,
                               kvs_err *err) {
    sentences s = {0};
    kvs_dataset *d = NULL;
    kvs_ds_buf hay = {0}, ctx = {0};
    size_t *starts = NULL;
    kvs_status st = KVS_OK;
    int on[N_KINDS], n_on = 0;
    *out = NULL;
    if (!hash) return kvs_errorf(err, KVS_ERR_INVALID, "needle: no hash function given");
    if (!o || o->n_lengths < 1 || o->n_depths < 1 || !o->lengths || !o->depths)
        return kvs_errorf(err, KVS_ERR_INVALID, "needle: need at least one length and one depth");
    int per = o->samples_per_cell > 0 ? o->samples_per_cell : 1;
    if (o->samples_per_cell < 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "needle: samples_per_cell %d is negative",
                          o->samples_per_cell);
    for (int i = 0; i < o->n_depths; i++)
        if (!(o->depths[i] >= 0.0 && o->depths[i] <= 1.0))
            return kvs_errorf(err, KVS_ERR_INVALID, "needle: depths[%d] = %g is outside [0, 1]", i,
                              o->depths[i]);
    for (int i = 0; i < o->n_lengths; i++)
        if (o->lengths[i] < 256)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "needle: lengths[%d] = %lld characters is too short for a needle and "
                              "its filler (at least 256)", i,
                              (long long)o->lengths[i]);
    st = parse_kinds(o->kinds, on, &n_on, err);
    if (st) return st;
    size_t src_len = 0;
    const char *src = o->haystack ? o->haystack : kvs_haystack_default(&src_len);
    if (o->haystack) src_len = o->haystack_len;
    st = sentences_split(src, src_len, &s, err);
    if (st) goto cleanup;
    char hay_hash[65], version[64];
    hash(s.text, s.len, hay_hash);
    snprintf(version, sizeof version, "%s+hay:%.12s", KVS_DS_NEEDLE_VERSION, hay_hash);
    st = kvs_ds_new("needle", "niah", version, "needle", &d, err);
    if (st) goto cleanup;
    int total = o->n_lengths * o->n_depths * per;
    d->samples = calloc((size_t)total, sizeof *d->samples); /* [total] */
    if (!d->samples) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "needle: out of memory for %d samples", total);
        goto cleanup;
    }
    int idx = 0;
    for (int li = 0; li < o->n_lengths; li++) {
        for (int di = 0; di < o->n_depths; di++) {
            for (int k = 0; k < per; k++, idx++) {
                int64_t L = o->lengths[li];
                double D = o->depths[di];
                uint64_t rng = o->seed * 0xD1B54A32D192ED03ull + (uint64_t)idx * 0x9E3779B97F4A7C15ull;
                needle nd;
                make_needle(on[kvs_rng_next(&rng) % (uint64_t)n_on], &rng, &nd);
                size_t nl = strlen(nd.sentence);
                int64_t target = L - (int64_t)nl - 1;
                assert(target >= 1); /* lengths >= 256, needle sentences < 128 */
                int n_starts = 0;
                free(starts);
                starts = NULL;
                hay.n = 0;
                st = build(&s, target, kvs_rng_next(&rng), &hay, &starts, &n_starts, err);
                if (st) goto cleanup;
                /* The boundary (a sentence start, or the end) nearest to D * hay length. */
                double want = D * (double)hay.n;
                size_t b = hay.n;
                double best = fabs((double)hay.n - want);
                for (int j = 0; j < n_starts; j++) {
                    double dist = fabs((double)starts[j] - want);
                    if (dist < best) {
                        best = dist;
                        b = starts[j];
                    }
                }
                ctx.n = 0;
                int64_t offset;
                if (b < hay.n) {
                    offset = (int64_t)b;
                    st = kvs_ds_buf_add(&ctx, hay.p, b, err);
                    if (!st) st = kvs_ds_buf_add(&ctx, nd.sentence, nl, err);
                    if (!st) st = kvs_ds_buf_add(&ctx, " ", 1, err);
                    if (!st) st = kvs_ds_buf_add(&ctx, hay.p + b, hay.n - b, err);
                } else {
                    st = kvs_ds_buf_add(&ctx, hay.p ? hay.p : "", hay.n, err);
                    if (!st && hay.n) st = kvs_ds_buf_add(&ctx, " ", 1, err);
                    offset = (int64_t)ctx.n;
                    if (!st) st = kvs_ds_buf_add(&ctx, nd.sentence, nl, err);
                }
                if (st) goto cleanup;
                kvs_sample *sm = &d->samples[idx];
                d->n_samples = idx + 1;
                char id[96];
                snprintf(id, sizeof id, "L%lld-D%g-S%d", (long long)L, D, k);
                sm->id = kvs_ds_strdup(id);
                sm->context = kvs_ds_buf_take(&ctx, err);
                sm->question = kvs_ds_strdup(nd.question);
                sm->answers = calloc(1, sizeof *sm->answers);
                if (sm->answers) {
                    sm->answers[0] = kvs_ds_strdup(nd.value);
                    sm->n_answers = 1;
                }
                sm->has_needle = 1;
                sm->needle.kind = kvs_ds_strdup(nd.kind);
                sm->needle.value = kvs_ds_strdup(nd.value);
                sm->needle.depth = D;
                sm->needle.offset = offset;
                sm->needle.length = L;
                /* the answer's bytes inside the needle sentence, for kv_spans */
                const char *vp = strstr(nd.sentence, nd.value);
                sm->spans = malloc(sizeof *sm->spans);
                if (sm->spans && vp) {
                    sm->spans[0].start = offset + (int64_t)(vp - nd.sentence);
                    sm->spans[0].end = sm->spans[0].start + (int64_t)strlen(nd.value);
                    sm->n_spans = 1;
                }
                if (!sm->spans || !sm->id || !sm->context || !sm->question || !sm->answers || !sm->answers[0] ||
                    !sm->needle.kind || !sm->needle.value) {
                    st = kvs_errorf(err, KVS_ERR_NOMEM, "needle: out of memory for sample %s", id);
                    goto cleanup;
                }
                assert((int64_t)strlen(sm->context) <= L);
            }
        }
    }
    st = kvs_ds_hash_dataset(d, hash, err);
    if (st) goto cleanup;
    *out = d;
    d = NULL;
cleanup:
    free(starts);
    kvs_ds_buf_free(&hay);
    kvs_ds_buf_free(&ctx);
    sentences_free(&s);
    kvs_dataset_free(d);
    return st;
}
