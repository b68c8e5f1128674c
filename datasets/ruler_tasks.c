/*
 * ruler_tasks.c -- kvsieve_datasets: the prompt builders of RULER's tasks
 * (niah, variable tracking, common and frequent words extraction, qa) with
 * RULER's templates and answer prefixes, for one sample and one haystack
 * size (see the RULER section of kvs_datasets.h for the definitions
 * followed).
 * Not here: the task table, fitting to a token length and the dataset
 * (ruler.c), the data files (ruler_data.c). Every draw comes from splitmix64
 * streams derived from the sample's seed, so a builder called twice with the
 * same size gives the same prompt.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruler_internal.h"

/* ---- templates (constants.py: template + answer_prefix) ------------------------------ */

static const char *const tmpl_niah =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text? The special "
    "magic {type_needle_v} for {query} mentioned in the provided text are";
static const char *const tmpl_vt =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above. Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assgined the value {query}, they are: ";
static const char *const tmpl_cwe =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list? Answer: The top 10 words that appear most often in the list are:";
static const char *const tmpl_fwe =
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text? Answer: According to the coded text above, the three most frequently "
    "appeared words are:";
static const char *const tmpl_qa =
    "Answer the question based on the given documents. Only give me the answer and do not output "
    "any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question "
    "based on the given documents. Only give me the answer and do not output any other words.\n\n"
    "Question: {query} Answer:";

/* Replace every occurrence of `from` in s by `to` (s is malloc'd; returns a
 * new string and frees s, or NULL when out of memory). */
static char *replace_all(char *s, const char *from, const char *to) {
    if (!s) return NULL;
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from)) n++;
    if (!n) return s;
    char *out = malloc(strlen(s) + n * tl + 1);
    if (!out) {
        free(s);
        return NULL;
    }
    char *o = out;
    const char *p = s, *q;
    while ((q = strstr(p, from))) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, tl);
        o += tl;
        p = q + fl;
    }
    strcpy(o, p);
    free(s);
    return out;
}

/* Fill {type_needle_v}, {query}, {num_v} of a template and split it at
 * {context}: *pre before, *post after. */
static kvs_status fill_template(const char *tmpl, const char *type_v, const char *query, int num_v,
                                char **pre, char **post, kvs_err *err) {
    kvs_ds_buf a = {0}, b = {0};
    kvs_ds_buf *cur = &a;
    kvs_status st = KVS_OK;
    *pre = *post = NULL;
    for (const char *p = tmpl; !st && *p;) {
        if (*p == '{') {
            const char *e = strchr(p, '}');
            assert(e);
            size_t n = (size_t)(e - p - 1);
            if (n == 13 && !strncmp(p + 1, "type_needle_v", n)) st = kvs_ds_buf_adds(cur, type_v, err);
            else if (n == 5 && !strncmp(p + 1, "query", n)) st = kvs_ds_buf_adds(cur, query, err);
            else if (n == 5 && !strncmp(p + 1, "num_v", n)) st = kvs_ds_buf_addf(cur, err, "%d", num_v);
            else if (n == 7 && !strncmp(p + 1, "context", n)) cur = &b;
            else assert(0 && "unknown placeholder");
            p = e + 1;
        } else {
            const char *q = p;
            while (*q && *q != '{') q++;
            st = kvs_ds_buf_add(cur, p, (size_t)(q - p), err);
            p = q;
        }
    }
    if (!st) {
        *pre = kvs_ds_buf_take(&a, err);
        *post = *pre ? kvs_ds_buf_take(&b, err) : NULL;
        if (!*post) {
            free(*pre);
            *pre = NULL;
            st = KVS_ERR_NOMEM;
        }
    }
    kvs_ds_buf_free(&a);
    kvs_ds_buf_free(&b);
    return st;
}

/* ---- random draws ------------------------------------------------------------------ */

static uint64_t below(uint64_t *r, uint64_t n) { return n ? kvs_rng_next(r) % n : 0; }

/* Fisher-Yates over idx[0..n) */
static void shuffle_ints(uint64_t *r, int *idx, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)below(r, (uint64_t)i + 1);
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* k distinct values of [0, n) into out (n-sized scratch in idx). */
static void sample_ints(uint64_t *r, int *idx, int n, int k, int *out) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)below(r, (uint64_t)(n - i));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        out[i] = idx[i];
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void ruler_built_reset(built *b) {
    b->ctx.n = 0;
    if (b->ctx.p) b->ctx.p[0] = '\0';
    b->q.n = 0;
    if (b->q.p) b->q.p[0] = '\0';
    ruler_strv_free(&b->ans, 1);
    b->n_spans = 0;
}

void ruler_built_free(built *b) {
    kvs_ds_buf_free(&b->ctx);
    kvs_ds_buf_free(&b->q);
    ruler_strv_free(&b->ans, 1);
    free(b->spans);
    memset(b, 0, sizeof *b);
}

kvs_status ruler_add_span(built *b, int64_t s, int64_t e, kvs_err *err) {
    if (b->n_spans == b->cap_spans) {
        int c = b->cap_spans ? b->cap_spans * 2 : 8;
        kvs_span *v = realloc(b->spans, sizeof *v * (size_t)c);
        if (!v) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        b->spans = v;
        b->cap_spans = c;
    }
    b->spans[b->n_spans++] = (kvs_span){s, e};
    return KVS_OK;
}

kvs_status ruler_add_answer(built *b, const char *a, kvs_err *err) {
    char *c = kvs_ds_strdup(a);
    kvs_status st = ruler_strv_push(&b->ans, c, err);
    if (st) free(c);
    return st;
}

/* The generator of one (task, length). */

static kvs_status scratch(gen *g, size_t n, kvs_err *err) {
    if (g->scratch_n >= n) return KVS_OK;
    int *p = realloc(g->scratch, sizeof *p * n);
    if (!p) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory (%zu ints)", n);
    g->scratch = p;
    g->scratch_n = n;
    return KVS_OK;
}

static uint64_t stream(const gen *g, uint64_t which) {
    uint64_t s = g->sample_seed ^ (which * 0x9E3779B97F4A7C15ull);
    kvs_rng_next(&s);
    return s;
}

/* generate_random: a 7-digit number, an adjective-noun word, a version 4 UUID. */
static void random_item(gen *g, uint64_t *r, const char *type, char *out, size_t n) {
    if (!strcmp(type, "numbers")) {
        snprintf(out, n, "%u", (unsigned)(1000000u + below(r, 9000000u)));
    } else if (!strcmp(type, "words")) {
        snprintf(out, n, "%s-%s", g->adjs.v[below(r, (uint64_t)g->adjs.n)],
                 g->nouns.v[below(r, (uint64_t)g->nouns.n)]);
    } else {
        uint64_t hi = kvs_rng_next(r), lo = kvs_rng_next(r);
        hi = (hi & ~0xF000ull) | 0x4000ull;                    /* version 4 */
        lo = (lo & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull; /* variant 10 */
        snprintf(out, n, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32), (unsigned)((hi >> 16) & 0xFFFF),
                 (unsigned)(hi & 0xFFFF), (unsigned)(lo >> 48), (unsigned long long)(lo & 0xFFFFFFFFFFFFull));
    }
}

/* ---- niah ------------------------------------------------------------------------------ */

#define NEEDLE_FMT "One of the special magic %s for %s is: %s."
static const char *const repeat_hay =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

#define MAX_NEEDLES 100 /* num_needle_k x num_needle_v */
typedef struct {
    char text[256];
    int value_off, value_len; /* where the value sits in text */
    int answer;               /* 1 when its key is asked */
} needle_t;

kvs_status ruler_build_niah(gen *g, int64_t h, built *b, kvs_err *err) {
    const kvs_ruler_task *t = g->t;
    int nk = t->num_needle_k > t->num_needle_q ? t->num_needle_k : t->num_needle_q;
    int nv = t->num_needle_v, nq = t->num_needle_q, nn = nk * nv;
    uint64_t rkv = stream(g, 1), rpos = stream(g, 2), rhay = stream(g, 3);
    needle_t nd[MAX_NEEDLES];
    char keys[MAX_NEEDLES][64];
    int key_of[MAX_NEEDLES];
    kvs_status st = KVS_OK;
    char *pre = NULL, *post = NULL;
    for (int i = 0, m = 0; i < nk; i++) {
        random_item(g, &rkv, t->type_needle_k, keys[i], sizeof keys[i]);
        for (int j = 0; j < nv; j++, m++) {
            char val[64];
            random_item(g, &rkv, t->type_needle_v, val, sizeof val);
            int len = snprintf(nd[m].text, sizeof nd[m].text, NEEDLE_FMT, t->type_needle_v, keys[i], val);
            nd[m].value_len = (int)strlen(val);
            nd[m].value_off = len - 1 - nd[m].value_len;
            nd[m].answer = 0;
            key_of[m] = i;
        }
    }
    /* the needles in a random order */
    int order[MAX_NEEDLES];
    for (int i = 0; i < nn; i++) order[i] = i;
    shuffle_ints(&rkv, order, nn);
    /* the asked keys: answers are their values in key order */
    int kidx[MAX_NEEDLES], asked[MAX_NEEDLES];
    sample_ints(&rkv, kidx, nk, nq, asked);
    /* RULER's query: ', '.join(keys[:-1]) + ', and ' + keys[-1] for several keys */
    kvs_ds_buf query = {0};
    for (int a = 0; a < nq && !st; a++) {
        if (a > 0) st = kvs_ds_buf_adds(&query, a == nq - 1 ? ", and " : ", ", err);
        if (!st) st = kvs_ds_buf_adds(&query, keys[asked[a]], err);
        for (int m = 0; m < nn && !st; m++)
            if (key_of[m] == asked[a]) {
                nd[m].answer = 1;
                char v[64];
                snprintf(v, sizeof v, "%.*s", nd[m].value_len, nd[m].text + nd[m].value_off);
                st = ruler_add_answer(b, v, err);
            }
    }
    if (st) goto done;
    /* the template, singular when one value is asked */
    char type_v[16];
    snprintf(type_v, sizeof type_v, "%s", t->type_needle_v);
    char *tm = kvs_ds_strdup(tmpl_niah);
    if (nq * nv == 1) {
        tm = replace_all(tm, "Some", "A");
        tm = replace_all(tm, "are all", "is");
        tm = replace_all(tm, "are", "is");
        tm = replace_all(tm, "answers", "answer");
        type_v[strlen(type_v) - 1] = '\0';
    }
    if (!tm) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    st = fill_template(tm, type_v, query.p ? query.p : "", 0, &pre, &post, err);
    free(tm);
    if (st) goto done;
    if ((st = kvs_ds_buf_adds(&b->ctx, pre, err)) || (st = kvs_ds_buf_adds(&b->q, post, err))) goto done;
#define ADD_NEEDLE(m)                                                                           \
    do {                                                                                        \
        if (nd[m].answer)                                                                       \
            st = ruler_add_span(b, (int64_t)(b->ctx.n + (size_t)nd[m].value_off),                     \
                          (int64_t)(b->ctx.n + (size_t)nd[m].value_off + (size_t)nd[m].value_len), err); \
        if (!st) st = kvs_ds_buf_adds(&b->ctx, nd[m].text, err);                                \
    } while (0)
    if (!strcmp(t->type_haystack, "essay")) {
        /* the first h words of the essays, split into sentences; the needles
         * between sentences at depths drawn from 40 even steps of 0..100% */
        kvs_ds_buf text = {0};
        for (int64_t i = 0; i < h && !st; i++) {
            if (i) st = kvs_ds_buf_add(&text, " ", 1, err);
            if (!st) st = kvs_ds_buf_adds(&text, g->data->words.v[i], err);
        }
        size_t *ss = NULL;
        int ns = 0;
        if (!st) st = ruler_sentences(text.p ? text.p : "", text.n, &ss, &ns, err);
        int didx[40], dsel[40], ins[42];
        if (!st) {
            sample_ints(&rpos, didx, 40, nn, dsel);
            ins[0] = 0;
            for (int i = 0; i < nn; i++) ins[1 + i] = (int)((int64_t)ns * (int64_t)llround(100.0 * dsel[i] / 39.0) / 100);
            qsort(ins + 1, (size_t)nn, sizeof *ins, cmp_int);
            ins[nn + 1] = ns;
        }
        for (int i = 1; i <= nn + 1 && !st; i++) {
            /* " ".join(parts): the sentences [ins[i-1], ins[i]) then needle i-1 */
            if (i > 1) st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
            if (!st && ins[i] > ins[i - 1]) {
                size_t s0 = ss[ins[i - 1]];
                size_t s1 = ins[i] < ns ? ss[ins[i]] - 1 : text.n;
                st = kvs_ds_buf_add(&b->ctx, text.p + s0, s1 - s0, err);
            }
            if (!st && i - 1 < nn) {
                st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
                if (!st) ADD_NEEDLE(order[i - 1]);
            }
        }
        free(ss);
        kvs_ds_buf_free(&text);
    } else {
        /* h filler lines (the repeat text, or needles of random keys and
         * values), the needles inserted at distinct line positions */
        if ((st = scratch(g, (size_t)h + (size_t)nn + 1, err))) goto done;
        int *slot = malloc(sizeof *slot * (size_t)(h + nn)); /* -1-j: needle j; i: filler i */
        int pos[MAX_NEEDLES];
        if (!slot) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
            goto done;
        }
        sample_ints(&rpos, g->scratch, (int)h, nn, pos);
        qsort(pos, (size_t)nn, sizeof *pos, cmp_int);
        /* sentences.insert(index, needle) for the indexes in decreasing
         * order, needle j at the j-th largest index */
        int n = (int)h;
        for (int i = 0; i < n; i++) slot[i] = i;
        for (int j = 0; j < nn; j++) {
            int at = pos[nn - 1 - j];
            memmove(slot + at + 1, slot + at, sizeof *slot * (size_t)(n - at));
            slot[at] = -1 - order[j];
            n++;
        }
        int distract = !strcmp(t->type_haystack, "needle");
        for (int i = 0; i < n && !st; i++) {
            if (i) st = kvs_ds_buf_add(&b->ctx, "\n", 1, err);
            if (st) break;
            if (slot[i] < 0) {
                ADD_NEEDLE(-1 - slot[i]);
            } else if (distract) {
                char k[64], v[64];
                random_item(g, &rhay, t->type_needle_k, k, sizeof k);
                random_item(g, &rhay, t->type_needle_v, v, sizeof v);
                st = kvs_ds_buf_addf(&b->ctx, err, NEEDLE_FMT, t->type_needle_v, k, v);
            } else {
                st = kvs_ds_buf_adds(&b->ctx, repeat_hay, err);
            }
        }
        free(slot);
    }
#undef ADD_NEEDLE
done:
    kvs_ds_buf_free(&query);
    free(pre);
    free(post);
    return st;
}

/* ---- variable tracking ------------------------------------------------------------------- */

static const char *const vt_noise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";

/* One VT prompt with h noise lines: chains of `letters`-letter names.
 * Spans (offsets into b->ctx) mark the statements of the first chain. */
static kvs_status vt_prompt(gen *g, int64_t h, int letters, int hops, uint64_t salt, built *b,
                            kvs_err *err) {
    const kvs_ruler_task *t = g->t;
    int nc = t->num_chains, nvars = (hops + 1) * nc;
    uint64_t rkv = stream(g, 11 + salt), rpos = stream(g, 12 + salt);
    kvs_status st = KVS_OK;
    char(*vars)[8] = malloc(sizeof *vars * (size_t)nvars);
    char(*stmt)[40] = malloc(sizeof *stmt * (size_t)nvars);
    int *slot = NULL;
    char **pieces = NULL;
    int n_pieces = 0;
    char *pre = NULL, *post = NULL;
    if (!vars || !stmt) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    for (int i = 0; i < nvars; i++) {
        for (;;) { /* distinct names */
            for (int c = 0; c < letters; c++) vars[i][c] = (char)('A' + below(&rkv, 26));
            vars[i][letters] = '\0';
            int dup = 0;
            for (int j = 0; j < i; j++) dup |= !strcmp(vars[i], vars[j]);
            if (!dup) break;
        }
    }
    unsigned value0 = 0;
    for (int c = 0; c < nc; c++) {
        unsigned v = 10000u + (unsigned)below(&rkv, 89999u); /* randint(10000, 99999), upper excluded */
        if (c == 0) value0 = v;
        snprintf(stmt[c * (hops + 1)], sizeof stmt[0], "VAR %s = %u", vars[c * (hops + 1)], v);
        for (int j = 0; j < hops; j++)
            snprintf(stmt[c * (hops + 1) + j + 1], sizeof stmt[0], "VAR %s = VAR %s ",
                     vars[c * (hops + 1) + j + 1], vars[c * (hops + 1) + j]);
    }
    /* the noise lines; too few of them are cut into sentences (and the
     * chains to fit) as RULER does */
    int chain_len = hops + 1;
    int n = (int)h;
    int split = n <= chain_len;
    if (split) {
        static const char *const part[] = {"The grass is green.", " The sky is blue.", " The sun is yellow.",
                                           " Here we go.", " There and back again.", "\n"};
        n_pieces = n * 6;
        pieces = malloc(sizeof *pieces * (size_t)(n_pieces + 1));
        if (!pieces) {
            st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
            goto done;
        }
        for (int i = 0; i < n_pieces; i++) pieces[i] = (char *)part[i % 6];
        n = n_pieces;
        if (n <= chain_len) chain_len = n - 1;
    }
    slot = malloc(sizeof *slot * (size_t)(n + nc * chain_len + 1)); /* -1-s: statement s */
    if ((st = scratch(g, (size_t)(n + nc * chain_len + 1), err))) goto done;
    if (!slot) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) slot[i] = i;
    int cur = n;
    int pos[256];
    for (int c = 0; c < nc; c++) {
        /* sorted positions among the current sentences, statement j at pos+j */
        int k = chain_len < 256 ? chain_len : 256;
        sample_ints(&rpos, g->scratch, cur, k, pos);
        qsort(pos, (size_t)k, sizeof *pos, cmp_int);
        for (int j = 0; j < k; j++) {
            int at = pos[j] + j;
            memmove(slot + at + 1, slot + at, sizeof *slot * (size_t)(cur - at));
            slot[at] = -1 - (c * (hops + 1) + j);
            cur++;
        }
    }
    {
        char qv[16];
        snprintf(qv, sizeof qv, "%u", value0);
        if ((st = fill_template(tmpl_vt, "", qv, hops + 1, &pre, &post, err))) goto done;
    }
    if ((st = kvs_ds_buf_adds(&b->ctx, pre, err)) || (st = kvs_ds_buf_adds(&b->q, post, err))) goto done;
    /* " ".join(sentences).replace(". \n", ".\n"): the only ". \n" comes from
     * a sentence piece "...again." followed by the line end piece "\n" */
    for (int i = 0; i < cur && !st; i++) {
        const char *s;
        if (slot[i] < 0) {
            int sidx = -1 - slot[i];
            if (i) st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
            size_t sl = strlen(stmt[sidx]);
            while (sl > 0 && stmt[sidx][sl - 1] == ' ') sl--;
            if (!st && sidx < chain_len) st = ruler_add_span(b, (int64_t)b->ctx.n, (int64_t)(b->ctx.n + sl), err);
            if (!st) st = kvs_ds_buf_adds(&b->ctx, stmt[sidx], err);
            continue;
        }
        s = split ? pieces[slot[i]] : vt_noise;
        if (i) {
            int drop = s[0] == '\n' && b->ctx.n > 0 && b->ctx.p[b->ctx.n - 1] == '.';
            if (!drop) st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
        }
        if (!st) st = kvs_ds_buf_adds(&b->ctx, s, err);
    }
    for (int j = 0; j < chain_len && !st; j++) st = ruler_add_answer(b, vars[j], err);
done:
    free(vars);
    free(stmt);
    free(slot);
    free(pieces);
    free(pre);
    free(post);
    return st;
}

kvs_status ruler_build_vt(gen *g, int64_t h, built *b, kvs_err *err) {
    /* " " + the worked example + "\n\n" before the prompt; the example's
     * answer names replaced by fresh ones of the same length */
    kvs_status st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
    uint64_t r = stream(g, 19);
    char *icl = kvs_ds_strdup(g->icl);
    if (!icl) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
    /* the example's answers follow its last "they are: " */
    const char *mark = "they are: ";
    char *last = NULL;
    for (char *p = strstr(icl, mark); p; p = strstr(p + 1, mark)) last = p;
    if (last) {
        char *names = kvs_ds_strdup(last + strlen(mark));
        char *save = NULL;
        for (char *w = names ? strtok_r(names, " \n", &save) : NULL; w && icl; w = strtok_r(NULL, " \n", &save)) {
            char fresh[16];
            size_t wl = strlen(w) < 15 ? strlen(w) : 15;
            for (size_t c = 0; c < wl; c++) fresh[c] = (char)('A' + below(&r, 26));
            fresh[wl] = '\0';
            icl = replace_all(icl, w, fresh);
        }
        free(names);
        if (!icl) return kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
    }
    if (!st) st = kvs_ds_buf_adds(&b->ctx, icl, err);
    free(icl);
    if (!st) st = kvs_ds_buf_add(&b->ctx, "\n\n", 2, err);
    if (st) return st;
    size_t off = b->ctx.n;
    built main_b = {0};
    st = vt_prompt(g, h, 5, g->t->num_hops, 0, &main_b, err);
    if (!st) st = kvs_ds_buf_add(&b->ctx, main_b.ctx.p, main_b.ctx.n, err);
    if (!st) st = kvs_ds_buf_add(&b->q, main_b.q.p, main_b.q.n, err);
    for (int i = 0; i < main_b.n_spans && !st; i++)
        st = ruler_add_span(b, main_b.spans[i].start + (int64_t)off, main_b.spans[i].end + (int64_t)off, err);
    for (int i = 0; i < main_b.ans.n && !st; i++) st = ruler_add_answer(b, main_b.ans.v[i], err);
    ruler_built_free(&main_b);
    return st;
}

/* the ICL example's prompt (about 500 tokens, 3-letter names) */
kvs_status ruler_build_vt_icl(gen *g, int64_t h, built *b, kvs_err *err) {
    int hops = g->t->num_hops < 10 ? g->t->num_hops : 10;
    kvs_status st = vt_prompt(g, h, 3, hops, 100, b, err);
    /* its answer is part of the example: counted with it */
    for (int i = 0; i < b->ans.n && !st; i++) {
        st = kvs_ds_buf_add(&b->q, " ", 1, err);
        if (!st) st = kvs_ds_buf_adds(&b->q, b->ans.v[i], err);
    }
    return st;
}

/* ---- common words ---------------------------------------------------------------------- */

/* "1. w 2. w ..." of common x freq_c + uncommon x freq_u, shuffled */
static kvs_status cwe_list(gen *g, uint64_t *rsel, uint64_t *rshuf, int n_words, int freq_c,
                           int freq_u, kvs_ds_buf *out, ruler_strv *common, kvs_err *err) {
    int ncw = g->t->num_cw;
    int total = ncw * freq_c + (n_words - ncw) * freq_u;
    kvs_status st = scratch(g, (size_t)g->pool.n, err);
    int *list = malloc(sizeof *list * (size_t)(total > 0 ? total : 1));
    int *sel = malloc(sizeof *sel * (size_t)n_words);
    if (st || !list || !sel) {
        free(list);
        free(sel);
        return st ? st : kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
    }
    /* a random permutation of the pool, its first n_words words */
    for (int i = 0; i < g->pool.n; i++) g->scratch[i] = i;
    shuffle_ints(rsel, g->scratch, g->pool.n);
    memcpy(sel, g->scratch, sizeof *sel * (size_t)n_words);
    int m = 0;
    for (int i = 0; i < ncw; i++)
        for (int k = 0; k < freq_c; k++) list[m++] = sel[i];
    for (int i = ncw; i < n_words; i++)
        for (int k = 0; k < freq_u; k++) list[m++] = sel[i];
    shuffle_ints(rshuf, list, m);
    for (int i = 0; i < m && !st; i++)
        st = kvs_ds_buf_addf(out, err, "%s%d. %s", i ? " " : "", i + 1, g->pool.v[list[i]]);
    for (int i = 0; i < ncw && !st && common; i++) {
        char *c = kvs_ds_strdup(g->pool.v[sel[i]]);
        st = ruler_strv_push(common, c, err);
        if (st) free(c);
    }
    free(list);
    free(sel);
    return st;
}

kvs_status ruler_build_cwe(gen *g, int64_t h, built *b, kvs_err *err) {
    const kvs_ruler_task *t = g->t;
    int big = g->length >= 4096;
    uint64_t r1 = stream(g, 21), r2 = stream(g, 22), r3 = stream(g, 23), r4 = stream(g, 24);
    char *pre = NULL, *post = NULL;
    kvs_ds_buf ex = {0}, ctx = {0};
    ruler_strv ex_ans = {0};
    kvs_status st = fill_template(tmpl_cwe, "", "", 0, &pre, &post, err);
    if (st) return st;
    /* the worked example: 40 words, 10 x / 3 x (20 words, 3 x / 1 x below 4096) */
    int ex_words = big ? 40 : 20;
    if (ex_words > g->pool.n) ex_words = g->pool.n;
    if (ex_words <= t->num_cw) ex_words = t->num_cw + 1;
    st = cwe_list(g, &r1, &r2, ex_words, big ? 10 : 3, big ? 3 : 1, &ex, &ex_ans, err);
    if (!st) st = kvs_ds_buf_adds(&b->ctx, pre, err);
    if (!st) st = kvs_ds_buf_add(&b->ctx, ex.p, ex.n, err);
    if (!st) st = kvs_ds_buf_adds(&b->ctx, post, err);
    for (int i = 0; i < ex_ans.n && !st; i++)
        st = kvs_ds_buf_addf(&b->ctx, err, "%s%d. %s", i ? " " : "", i + 1, ex_ans.v[i]);
    if (!st) st = kvs_ds_buf_add(&b->ctx, "\n", 1, err);
    if (!st) st = kvs_ds_buf_adds(&b->ctx, pre, err);
    if (!st) st = cwe_list(g, &r3, &r4, (int)h, big ? t->freq_cw : 6, big ? t->freq_ucw : 1, &ctx, &b->ans, err);
    if (!st) st = kvs_ds_buf_add(&b->ctx, ctx.p, ctx.n, err);
    if (!st) st = kvs_ds_buf_adds(&b->q, post, err);
    kvs_ds_buf_free(&ex);
    kvs_ds_buf_free(&ctx);
    ruler_strv_free(&ex_ans, 1);
    free(pre);
    free(post);
    return st;
}

/* ---- frequent words ---------------------------------------------------------------------- */

static double zeta(double a) {
    /* Euler-Maclaurin: sum to N-1, then the tail N^(1-a)/(a-1) + N^-a/2 + a N^(-a-1)/12 */
    const int N = 64;
    double s = 0;
    for (int k = 1; k < N; k++) s += pow((double)k, -a);
    return s + pow(N, 1 - a) / (a - 1) + 0.5 * pow(N, -a) + a * pow(N, -a - 1) / 12.0;
}

kvs_status ruler_build_fwe(gen *g, int64_t h, built *b, kvs_err *err) {
    const kvs_ruler_task *t = g->t;
    int V = t->vocab_size > 0 ? t->vocab_size : (int)(g->length / 50);
    int wl = t->coded_wordlen;
    if (V < 5)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "ruler task '%s': length %lld gives a vocabulary of %d coded words (length / "
                          "50); at least 5 are needed", t->name, (long long)g->length, V);
    uint64_t rv = stream(g, 31), rs = stream(g, 32);
    char *voc = malloc((size_t)V * (size_t)(wl + 1));
    int *idx = malloc(sizeof *idx * (size_t)V);
    int *list = NULL;
    char *pre = NULL, *post = NULL;
    kvs_status st = KVS_OK;
    if (!voc || !idx) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    /* V distinct random words (sorted), in a random order */
    for (int i = 0; i < V; i++) {
        char *w = voc + (size_t)i * (size_t)(wl + 1);
        for (;;) {
            for (int c = 0; c < wl; c++) w[c] = (char)('a' + below(&rv, 26));
            w[wl] = '\0';
            int dup = 0;
            for (int j = 0; j < i && !dup; j++) dup = !strcmp(w, voc + (size_t)j * (size_t)(wl + 1));
            if (!dup) break;
        }
    }
    for (int i = 0; i < V; i++) idx[i] = i;
    shuffle_ints(&rv, idx, V);
    /* counts int(h k^-alpha / zeta(alpha)) for rank k = 1..V; rank 1 is the noise "..." */
    double z = zeta(t->alpha);
    int64_t total = 0;
    for (int k = 1; k <= V; k++) total += (int64_t)((double)h * pow(k, -t->alpha) / z);
    list = malloc(sizeof *list * (size_t)(total > 0 ? total : 1));
    if (!list) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    int64_t m = 0;
    for (int k = 1; k <= V; k++) {
        int64_t c = (int64_t)((double)h * pow(k, -t->alpha) / z);
        for (int64_t i = 0; i < c; i++) list[m++] = k - 1;
    }
    for (int64_t i = m - 1; i > 0; i--) {
        int64_t j = (int64_t)below(&rs, (uint64_t)i + 1);
        int x = list[i];
        list[i] = list[j];
        list[j] = x;
    }
    if ((st = fill_template(tmpl_fwe, "", "", 0, &pre, &post, err))) goto done;
    if ((st = kvs_ds_buf_adds(&b->ctx, pre, err)) || (st = kvs_ds_buf_adds(&b->q, post, err))) goto done;
    for (int64_t i = 0; i < m && !st; i++) {
        if (i) st = kvs_ds_buf_add(&b->ctx, " ", 1, err);
        if (!st) st = kvs_ds_buf_adds(&b->ctx, list[i] == 0 ? "..." : voc + (size_t)idx[list[i]] * (size_t)(wl + 1), err);
    }
    for (int k = 1; k <= 3 && !st; k++) st = ruler_add_answer(b, voc + (size_t)idx[k] * (size_t)(wl + 1), err);
done:
    free(voc);
    free(idx);
    free(list);
    free(pre);
    free(post);
    return st;
}

/* ---- qa ------------------------------------------------------------------------------------ */

kvs_status ruler_build_qa(gen *g, int64_t h, built *b, kvs_err *err) {
    const ruler_qa_set *q = g->qa;
    const ruler_qa *item = &q->qas[g->index % q->n_qas];
    uint64_t rs = stream(g, 41), rsh = stream(g, 42);
    int nd = q->docs.n;
    int *all = malloc(sizeof *all * (size_t)(nd > 0 ? nd : 1));
    unsigned char *used = calloc((size_t)nd, 1);
    char *pre = NULL, *post = NULL;
    kvs_status st = KVS_OK;
    if (!all || !used || (st = scratch(g, (size_t)nd, err))) {
        if (!st) st = kvs_errorf(err, KVS_ERR_NOMEM, "ruler: out of memory");
        goto done;
    }
    int n = 0;
    if (h < nd) {
        for (int i = 0; i < item->n_context; i++) all[n++] = item->context[i], used[item->context[i]] = 1;
        int want = (int)h - item->n_context;
        if (want > item->n_more) {
            /* the gold documents, the rest of the article, then random others */
            for (int i = 0; i < item->n_more; i++) all[n++] = item->more[i], used[item->more[i]] = 1;
            int na = 0;
            for (int i = 0; i < nd; i++)
                if (!used[i]) g->scratch[na++] = i;
            int k = (int)h - n;
            if (k > na) k = na;
            for (int i = 0; i < k; i++) {
                int j = i + (int)below(&rs, (uint64_t)(na - i));
                int x = g->scratch[i];
                g->scratch[i] = g->scratch[j];
                g->scratch[j] = x;
                all[n++] = g->scratch[i];
            }
        } else if (want > 0) {
            int mm = item->n_more;
            for (int i = 0; i < mm; i++) g->scratch[i] = item->more[i];
            for (int i = 0; i < want; i++) {
                int j = i + (int)below(&rs, (uint64_t)(mm - i));
                int x = g->scratch[i];
                g->scratch[i] = g->scratch[j];
                g->scratch[j] = x;
                all[n++] = g->scratch[i];
            }
        }
    } else {
        for (int i = 0; i < nd; i++) all[n++] = i;
    }
    shuffle_ints(&rsh, all, n);
    if ((st = fill_template(tmpl_qa, "", item->query, 0, &pre, &post, err))) goto done;
    if ((st = kvs_ds_buf_adds(&b->ctx, pre, err)) || (st = kvs_ds_buf_adds(&b->q, post, err))) goto done;
    for (int i = 0; i < n && !st; i++)
        st = kvs_ds_buf_addf(&b->ctx, err, "%sDocument %d:\n%s", i ? "\n\n" : "", i + 1, q->docs.v[all[i]]);
    for (int i = 0; i < item->n_outputs && !st; i++) st = ruler_add_answer(b, item->outputs[i], err);
done:
    free(all);
    free(used);
    free(pre);
    free(post);
    return st;
}
