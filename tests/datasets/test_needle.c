/*
 * test_needle.c -- the needle / passkey generator and the haystack builder:
 * determinism in the seed, needle placement at the requested depth, context
 * lengths, needle kinds, the shipped haystack's invariants, error paths.
 * Not a test of model accuracy (that is the runner's integration test).
 */
#include <ctype.h>
#include <string.h>

#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "kvs_metrics.h"
#include "test_util.h"

static int count_occ(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static kvs_dataset *gen(const int64_t *L, int nL, const double *D, int nD, int per, uint64_t seed,
                        const char *kinds) {
    kvs_err err = {0};
    kvs_needle_opts o = {L, nL, D, nD, per, seed, kinds, NULL, 0};
    kvs_dataset *d = NULL;
    CHECK_OK(kvs_needle_generate(&o, kvs_sha256_hex, &d, &err), &err);
    return d;
}

int main(void) {
    kvs_err err = {0};

    /* The shipped haystack: no digits, no needle words, headings skipped. */
    size_t hl = 0;
    const char *hay = kvs_haystack_default(&hl);
    CHECK(hl > 20000);
    CHECK_EQ_INT(strlen(hay), hl);
    int digits = 0;
    for (size_t i = 0; i < hl; i++) digits += isdigit((unsigned char)hay[i]) != 0;
    CHECK_EQ_INT(digits, 0);
    CHECK(!strstr(hay, "passkey") && !strstr(hay, "magic") && !strstr(hay, "Lisbon"));

    /* kvs_haystack_build: deterministic, <= target, within one sentence of it. */
    char *h1 = NULL, *h2 = NULL, *h3 = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    CHECK_OK(kvs_haystack_build(hay, hl, 5000, 1, &h1, &n1, &err), &err);
    CHECK_OK(kvs_haystack_build(hay, hl, 5000, 1, &h2, &n2, &err), &err);
    CHECK_OK(kvs_haystack_build(hay, hl, 5000, 2, &h3, &n3, &err), &err);
    CHECK(h1 && h2 && h3);
    if (h1 && h2 && h3) {
        CHECK(n1 == n2 && !memcmp(h1, h2, n1));
        CHECK(n1 != n3 || memcmp(h1, h3, n1) != 0);
        CHECK(n1 <= 5000 && n1 > 5000 - 400);
        CHECK_EQ_INT(strlen(h1), n1);
        CHECK(strchr(".!?", h1[n1 - 1]) != NULL);
        CHECK(!strstr(h1, "  ") && !strchr(h1, '\n') && !strchr(h1, '#'));
    }
    free(h1);
    free(h2);
    free(h3);
    /* longer than the source: wraps around */
    CHECK_OK(kvs_haystack_build(hay, hl, 100000, 3, &h1, &n1, &err), &err);
    CHECK(h1 && n1 <= 100000 && n1 > 100000 - 400);
    free(h1);
    const char *tiny = "One short line. Two short line! Three?";
    CHECK_OK(kvs_haystack_build(tiny, strlen(tiny), 40, 0, &h1, &n1, &err), &err);
    CHECK(h1 && n1 <= 40 && n1 >= 20);
    free(h1);
    CHECK_FAILS(kvs_haystack_build("no sentence here", 16, 100, 0, &h1, &n1, &err),
                KVS_ERR_INVALID, &err, "fewer than 2 sentences");

    /* The generator: same seed -> same bytes and hash; another seed -> different. */
    const int64_t L[] = {2000, 8000, 20000};
    const double D[] = {0.0, 0.25, 0.5, 0.75, 1.0};
    kvs_dataset *a = gen(L, 3, D, 5, 2, 42, NULL);
    kvs_dataset *b = gen(L, 3, D, 5, 2, 42, NULL);
    kvs_dataset *c = gen(L, 3, D, 5, 2, 43, NULL);
    if (!a || !b || !c) return kvs_test_finish("test_needle");
    CHECK_EQ_INT(a->n_samples, 30);
    CHECK(!strcmp(a->hash, b->hash));
    CHECK(strcmp(a->hash, c->hash) != 0);
    CHECK_EQ_INT(strlen(a->hash), 64);
    CHECK(!strncmp(a->version, "niah-1+hay:", 11) && strlen(a->version) == 11 + 12);
    CHECK(!strcmp(a->version, c->version)); /* same haystack */
    CHECK(!strcmp(a->metric, "needle") && !strcmp(a->kind, "needle"));
    int same_ctx = 0, kinds_seen[3] = {0, 0, 0};
    for (int i = 0; i < a->n_samples; i++) {
        const kvs_sample *s = &a->samples[i], *t = &b->samples[i], *u = &c->samples[i];
        CHECK(!strcmp(s->context, t->context) && !strcmp(s->question, t->question));
        CHECK(!strcmp(s->id, u->id));
        same_ctx += !strcmp(s->context, u->context);
        CHECK(s->has_needle && s->n_answers == 1 && !strcmp(s->answers[0], s->needle.value));
        CHECK(!kvs_sample_has_images(s));
        int64_t len = (int64_t)strlen(s->context), Lr = s->needle.length;
        /* length: at most the target, short of it by less than one sentence */
        CHECK_MSG(len <= Lr && len > Lr - 400, "sample %s: length %lld for target %lld", s->id,
                  (long long)len, (long long)Lr);
        /* the value occurs exactly once: in the needle sentence at needle.offset */
        CHECK_EQ_INT(count_occ(s->context, s->needle.value), 1);
        const char *at = s->context + s->needle.offset;
        const char *v = strstr(at, s->needle.value);
        CHECK(v && v - at < 120);
        CHECK(s->needle.offset == 0 || s->context[s->needle.offset - 1] == ' ');
        /* depth: offset / context length within half a sentence plus the needle */
        double ratio = (double)s->needle.offset / (double)len;
        double tol = 250.0 / (double)Lr + 0.005;
        CHECK_MSG(fabs(ratio - s->needle.depth) <= tol, "sample %s: needle at %.4f, want %.2f (tol %.4f)",
                  s->id, ratio, s->needle.depth, tol);
        if (s->needle.depth == 0.0) CHECK_EQ_INT(s->needle.offset, 0);
        if (s->needle.depth == 1.0) CHECK(strlen(at) < 80); /* only the needle sentence follows */
        /* the needle metric scores its own value as correct and the haystack as wrong */
        const char *const ans[] = {s->answers[0]};
        CHECK_NEAR(kvs_metric_needle(at, ans, 1, NULL, 0), 1.0, 0);
        if (!strcmp(s->needle.kind, "passkey")) {
            kinds_seen[0]++;
            CHECK_EQ_INT(strlen(s->needle.value), 5);
            CHECK(!strcmp(s->question, "What is the secret passkey?"));
        } else if (!strcmp(s->needle.kind, "city")) {
            kinds_seen[1]++;
            CHECK(isupper((unsigned char)s->needle.value[0]));
            CHECK(strstr(s->question, "city") != NULL);
        } else {
            CHECK(!strcmp(s->needle.kind, "number"));
            kinds_seen[2]++;
            CHECK_EQ_INT(strlen(s->needle.value), 7);
        }
    }
    CHECK(same_ctx < 3); /* a different seed changes (almost) every context */
    CHECK(kinds_seen[0] > 0 && kinds_seen[1] > 0 && kinds_seen[2] > 0);
    kvs_dataset_free(a);
    kvs_dataset_free(b);
    kvs_dataset_free(c);

    /* one kind only */
    a = gen(L, 1, D, 5, 3, 5, "passkey");
    if (a) {
        for (int i = 0; i < a->n_samples; i++) CHECK(!strcmp(a->samples[i].needle.kind, "passkey"));
        kvs_dataset_free(a);
    }
    a = gen(L, 1, D, 2, 3, 5, "city, number");
    if (a) {
        for (int i = 0; i < a->n_samples; i++) CHECK(strcmp(a->samples[i].needle.kind, "passkey") != 0);
        kvs_dataset_free(a);
    }

    /* approximate tokens */
    CHECK_EQ_INT(kvs_tokens_to_chars(1000), 4000);

    /* errors */
    kvs_dataset *d = NULL;
    const double bad_d[] = {0.5, 1.5};
    kvs_needle_opts o = {L, 1, bad_d, 2, 1, 1, NULL, NULL, 0};
    CHECK_FAILS(kvs_needle_generate(&o, kvs_sha256_hex, &d, &err), KVS_ERR_INVALID, &err, "depths[1]");
    const int64_t short_l[] = {10};
    kvs_needle_opts o2 = {short_l, 1, D, 1, 1, 1, NULL, NULL, 0};
    CHECK_FAILS(kvs_needle_generate(&o2, kvs_sha256_hex, &d, &err), KVS_ERR_INVALID, &err, "too short");
    const int64_t l255[] = {4000, 255};
    kvs_needle_opts o3 = {l255, 2, D, 1, 1, 1, "passkey", NULL, 0};
    CHECK_FAILS(kvs_needle_generate(&o3, kvs_sha256_hex, &d, &err), KVS_ERR_INVALID, &err, "lengths[1] = 255");
    /* the shortest allowed length still holds the longest needle and some filler */
    const int64_t l256[] = {256};
    a = gen(l256, 1, D, 5, 4, 9, "number");
    if (a) {
        for (int i = 0; i < a->n_samples; i++)
            CHECK(strlen(a->samples[i].context) <= 256 && strlen(a->samples[i].context) > 100);
        kvs_dataset_free(a);
    }
    kvs_needle_opts o4 = {L, 1, D, 1, 1, 1, "pasky", NULL, 0};
    CHECK_FAILS(kvs_needle_generate(&o4, kvs_sha256_hex, &d, &err), KVS_ERR_NOTFOUND, &err,
                "did you mean 'passkey'");
    kvs_needle_opts o5 = {L, 1, D, 1, 1, 1, NULL, NULL, 0};
    CHECK_FAILS(kvs_needle_generate(&o5, NULL, &d, &err), KVS_ERR_INVALID, &err, "hash");
    CHECK(d == NULL);
    return kvs_test_finish("test_needle");
}
