/*
 * test_prompt.c -- prompt templates: built-ins, rendering in both modes
 * (query-aware: everything in the compressed part; query-agnostic: context
 * compressed, question appended), choices, literal braces, unknown
 * placeholders, template hashes and mode names.
 */
#include <string.h>

#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "test_util.h"

int main(void) {
    kvs_err err = {0};
    const kvs_prompt_template *t = NULL;
    CHECK_OK(kvs_prompt_template_get("needle", &t, &err), &err);
    if (!t) return kvs_test_finish("test_prompt");
    char *ans[] = {"48213"};
    kvs_sample s = {.id = "s0", .context = "Filler text. The secret passkey is 48213.",
                    .question = "What is the secret passkey?", .answers = ans, .n_answers = 1};
    char *c1 = NULL, *a1 = NULL, *c2 = NULL, *a2 = NULL;
    CHECK_OK(kvs_prompt_render(t, &s, KVS_PROMPT_QUERY_AWARE, &c1, &a1, &err), &err);
    CHECK_OK(kvs_prompt_render(t, &s, KVS_PROMPT_QUERY_AGNOSTIC, &c2, &a2, &err), &err);
    if (c1 && a1 && c2 && a2) {
        CHECK(strstr(c1, s.context) && strstr(c1, s.question));
        CHECK(!strcmp(a1, ""));
        CHECK(strstr(c2, s.context) && !strstr(c2, s.question));
        CHECK(strstr(a2, s.question) && !strstr(a2, s.context));
        /* the same text, split in two places */
        size_t n2 = strlen(c2);
        CHECK(strlen(c1) == n2 + strlen(a2) && !strncmp(c1, c2, n2) && !strcmp(c1 + n2, a2));
        CHECK(strstr(c1, "{") == NULL);
    }
    free(c1);
    free(a1);
    free(c2);
    free(a2);

    /* choices, literal braces, a custom template */
    char *ch[] = {"red", "blue"};
    s.choices = ch;
    s.n_choices = 2;
    kvs_prompt_template ct = {"mine", "3", "Doc {{x}}: {context}\n", "Q: {question}\n{choices}A:"};
    CHECK_OK(kvs_prompt_render(&ct, &s, KVS_PROMPT_QUERY_AGNOSTIC, &c1, &a1, &err), &err);
    if (c1 && a1) {
        CHECK_MSG(!strcmp(c1, "Doc {x}: Filler text. The secret passkey is 48213.\n"), "%s", c1);
        CHECK_MSG(!strcmp(a1, "Q: What is the secret passkey?\nA. red\nB. blue\nA:"), "%s", a1);
    }
    free(c1);
    free(a1);
    kvs_prompt_template bad = {"broken", "1", "{context} {foo}", "{question}"};
    CHECK_FAILS(kvs_prompt_render(&bad, &s, KVS_PROMPT_QUERY_AWARE, &c1, &a1, &err), KVS_ERR_INVALID,
                &err, "unknown placeholder '{foo}'");
    CHECK(c1 == NULL && a1 == NULL);
    kvs_prompt_template open_t = {"open", "1", "{context", "{question}"};
    CHECK_FAILS(kvs_prompt_render(&open_t, &s, KVS_PROMPT_QUERY_AWARE, &c1, &a1, &err),
                KVS_ERR_INVALID, &err, "unclosed '{'");

    /* every built-in renders a multiple-choice sample */
    const char *names[] = {"needle", "qa", "choice", "milebench"};
    char hashes[4][65];
    for (int i = 0; i < 4; i++) {
        CHECK_OK(kvs_prompt_template_get(names[i], &t, &err), &err);
        CHECK_OK(kvs_prompt_render(t, &s, KVS_PROMPT_QUERY_AWARE, &c1, &a1, &err), &err);
        CHECK(c1 && strstr(c1, s.context));
        free(c1);
        free(a1);
        CHECK_OK(kvs_prompt_template_hash(t, kvs_sha256_hex, hashes[i], &err), &err);
        CHECK_EQ_INT(strlen(hashes[i]), 64);
        for (int j = 0; j < i; j++) CHECK(strcmp(hashes[i], hashes[j]) != 0);
    }
    CHECK_OK(kvs_prompt_template_get("choice", &t, &err), &err);
    CHECK_OK(kvs_prompt_render(t, &s, KVS_PROMPT_QUERY_AWARE, &c1, &a1, &err), &err);
    CHECK(c1 && strstr(c1, "A. red\nB. blue\n"));
    free(c1);
    free(a1);

    /* template hash: over name, version and both parts */
    char h1[65], h2[65], h3[65];
    kvs_prompt_template t1 = {"x", "1", "{context}", "{question}"};
    kvs_prompt_template t2 = {"x", "2", "{context}", "{question}"};
    kvs_prompt_template t3 = {"x", "1", "{context}{question}", ""};
    CHECK_OK(kvs_prompt_template_hash(&t1, kvs_sha256_hex, h1, &err), &err);
    CHECK_OK(kvs_prompt_template_hash(&t2, kvs_sha256_hex, h2, &err), &err);
    CHECK_OK(kvs_prompt_template_hash(&t3, kvs_sha256_hex, h3, &err), &err);
    CHECK(strcmp(h1, h2) != 0 && strcmp(h1, h3) != 0);
    char expect[65];
    kvs_sha256_hex("x\0" "1\0" "{context}\0" "{question}", 2 + 2 + 10 + 10, expect);
    CHECK(!strcmp(h1, expect));

    /* names */
    CHECK_FAILS(kvs_prompt_template_get("neddle", &t, &err), KVS_ERR_NOTFOUND, &err,
                "did you mean 'needle'");
    kvs_prompt_mode m = KVS_PROMPT_QUERY_AWARE;
    CHECK_OK(kvs_prompt_mode_parse("query_agnostic", &m, &err), &err);
    CHECK(m == KVS_PROMPT_QUERY_AGNOSTIC);
    CHECK(!strcmp(kvs_prompt_mode_name(m), "query_agnostic"));
    CHECK(!strcmp(kvs_prompt_mode_name(KVS_PROMPT_QUERY_AWARE), "query_aware"));
    CHECK_FAILS(kvs_prompt_mode_parse("query-agnostic", &m, &err), KVS_ERR_INVALID, &err,
                "did you mean 'query_agnostic'");
    return kvs_test_finish("test_prompt");
}
