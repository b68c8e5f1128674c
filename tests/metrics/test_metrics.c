/*
 * test_metrics.c -- eval/metrics.c on hand-computed cases: normalisation,
 * exact match, contains, multiple-choice extraction, ROUGE-L F1 (LCS worked
 * out by hand in the comments), needle accuracy, RULER's string_match_all /
 * _part (and that they only grow with the prediction: why RULER requests
 * stop at no string), and the lookup by name.
 * Not a test of aggregation or reports.
 */
#include <stdint.h>
#include <string.h>

#include "kvs_metrics.h"
#include "test_util.h"

#define A(...) ((const char *const[]){__VA_ARGS__})
#define N(...) ((int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)))
#define M(fn, pred, ...) fn(pred, A(__VA_ARGS__), N(__VA_ARGS__), NULL, 0)

static void check_norm(const char *in, const char *want) {
    char *got = kvs_metric_normalize(in);
    CHECK_MSG(got && !strcmp(got, want), "normalize(\"%s\") = \"%s\", want \"%s\"", in,
              got ? got : "(null)", want);
    free(got);
}

int main(void) {
    /* SQuAD normalisation: lowercase, punctuation removed, articles dropped, spaces collapsed. */
    check_norm("The  Cat, sat!", "cat sat");
    check_norm("  An apple a day\tkeeps... THE doctor away ", "apple day keeps doctor away");
    check_norm("don't", "dont");
    check_norm("theory", "theory"); /* "the" only as a whole word */
    check_norm("", "");

    /* exact match */
    CHECK_NEAR(M(kvs_metric_exact_match, "The Eiffel Tower.", "eiffel tower"), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_exact_match, "Eiffel", "eiffel tower"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_exact_match, "Paris", "London", "paris"), 1.0, 0); /* max over answers */
    CHECK_NEAR(M(kvs_metric_exact_match, "It is Paris", "Paris"), 0.0, 0);
    CHECK_NEAR(kvs_metric_exact_match("Paris", NULL, 0, NULL, 0), 0.0, 0);

    /* contains: on word boundaries of the normalised strings */
    CHECK_NEAR(M(kvs_metric_contains, "It is the Eiffel Tower, I think.", "Eiffel tower"), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_contains, "eiffelish tower", "eiffel"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_contains, "abc", "b"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_contains, "I don't know", "London", "know"), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_contains, "Nothing here", "London"), 0.0, 0);

    /* multiple choice */
    const char *const ch[] = {"London", "Paris", "Rome"};
    CHECK_EQ_INT(kvs_metric_extract_choice("B", ch, 3), 'B');
    CHECK_EQ_INT(kvs_metric_extract_choice("  (C) Rome", ch, 3), 'C');
    CHECK_EQ_INT(kvs_metric_extract_choice("The answer is (C).", ch, 3), 'C');
    CHECK_EQ_INT(kvs_metric_extract_choice("Answer: A", ch, 3), 'A');
    CHECK_EQ_INT(kvs_metric_extract_choice("I think it must be B.", ch, 3), 'B');
    CHECK_EQ_INT(kvs_metric_extract_choice("I would pick Paris, clearly", ch, 3), 'B');
    CHECK_EQ_INT(kvs_metric_extract_choice("Paris or Rome", ch, 3), 0);  /* ambiguous */
    CHECK_EQ_INT(kvs_metric_extract_choice("D", ch, 3), 0);              /* out of range */
    CHECK_EQ_INT(kvs_metric_extract_choice("Answer: D", NULL, 0), 'D');  /* A-E without choices */
    CHECK_EQ_INT(kvs_metric_extract_choice("A cat is an animal", (const char *const[]){"dog", "cat"}, 2), 'B');
    CHECK_NEAR(kvs_metric_choice("B. Paris", A("B"), 1, ch, 3), 1.0, 0);
    CHECK_NEAR(kvs_metric_choice("B. Paris", A("(b)"), 1, ch, 3), 1.0, 0);
    CHECK_NEAR(kvs_metric_choice("I would pick Paris", A("Paris"), 1, ch, 3), 1.0, 0); /* text answer */
    CHECK_NEAR(kvs_metric_choice("A", A("Paris"), 1, ch, 3), 0.0, 0);
    CHECK_NEAR(kvs_metric_choice("no idea", A("A"), 1, ch, 3), 0.0, 0);

    /* ROUGE-L F1 over normalised words.
     * "the cat sat on the mat" -> cat sat on mat (4); "the cat is on the mat" -> cat is on mat (4);
     * LCS = cat on mat = 3, P = R = 3/4, F = 0.75. */
    CHECK_NEAR(M(kvs_metric_rouge_l, "the cat sat on the mat", "the cat is on the mat"), 0.75, 1e-12);
    /* police killed gunman / police kill gunman: LCS 2 of 3 and 3 -> 2/3 */
    CHECK_NEAR(M(kvs_metric_rouge_l, "police killed the gunman", "police kill the gunman"), 2.0 / 3.0, 1e-12);
    /* x y z w vs y w: LCS 2, P = 2/4, R = 2/2, F = 2*.5*1/1.5 = 2/3 */
    CHECK_NEAR(M(kvs_metric_rouge_l, "x y z w", "y w"), 2.0 / 3.0, 1e-12);
    /* order matters: w y vs y w: LCS 1, P = R = 1/2 */
    CHECK_NEAR(M(kvs_metric_rouge_l, "w y", "y w"), 0.5, 1e-12);
    CHECK_NEAR(M(kvs_metric_rouge_l, "Same words here.", "same words here"), 1.0, 1e-12);
    CHECK_NEAR(M(kvs_metric_rouge_l, "", "anything"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_rouge_l, "w y", "q", "y w"), 0.5, 1e-12); /* max over answers */

    /* needle: digit values against digit runs; other values as contains */
    CHECK_NEAR(M(kvs_metric_needle, "The secret passkey is 48213.", "48213"), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "passkey=48213", " 48213 "), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "The passkey is 482130", "48213"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "It is 48,213", "48213"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "I do not know", "48213"), 0.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "She moved to Lisbon!", "Lisbon"), 1.0, 0);
    CHECK_NEAR(M(kvs_metric_needle, "She moved to Lisbonne", "Lisbon"), 0.0, 0);

    /* RULER: string_match_all is the mean over references of "reference in
     * prediction" (case-insensitive, no normalisation); string_match_part
     * is the max. Hand cases as RULER's Python computes them. */
    {
        const char *two[] = {"1234567", "7654321"};
        const char *four[] = {"ABCDE", "FGHIJ", "KLMNO", "PQRST"};
        const char *qa[] = {"Paris", "the city of Paris"};
        CHECK_NEAR(kvs_metric_string_match_all("The numbers are 1234567 and 7654321.", two, 2, NULL, 0), 1.0, 0);
        CHECK_NEAR(kvs_metric_string_match_all("The number is 1234567.", two, 2, NULL, 0), 0.5, 0);
        CHECK_NEAR(kvs_metric_string_match_all("12345678", two, 1, NULL, 0), 1.0, 0); /* substring, like RULER */
        CHECK_NEAR(kvs_metric_string_match_all("abcde fghij and pqrst", four, 4, NULL, 0), 0.75, 0);
        CHECK_NEAR(kvs_metric_string_match_all("", four, 4, NULL, 0), 0.0, 0);
        CHECK_NEAR(kvs_metric_string_match_all("anything", four, 0, NULL, 0), 0.0, 0);
        CHECK_NEAR(kvs_metric_string_match_all("x", (const char *[]){""}, 1, NULL, 0), 1.0, 0); /* "" in s */
        CHECK_NEAR(kvs_metric_string_match_part("PARIS, of course", qa, 2, NULL, 0), 1.0, 0);
        CHECK_NEAR(kvs_metric_string_match_part("It is in the city of paris", qa, 2, NULL, 0), 1.0, 0);
        CHECK_NEAR(kvs_metric_string_match_part("Lyon", qa, 2, NULL, 0), 0.0, 0);
        CHECK_NEAR(kvs_metric_string_match_part("P a r i s", qa, 2, NULL, 0), 0.0, 0); /* no normalisation */
        kvs_metric_fn rf = NULL;
        kvs_err e0 = {0};
        CHECK_OK(kvs_metric_lookup("ruler", &rf, &e0), &e0);
        CHECK(rf == kvs_metric_string_match_all);
        CHECK_OK(kvs_metric_lookup("string_match_part", &rf, &e0), &e0);
        CHECK(rf == kvs_metric_string_match_part);
    }

    /* Why RULER requests carry no stop string (docs/experiments.md): both
     * metrics only grow as the prediction grows (a reference found in a
     * prefix is found in every extension), so stopping early can only lose
     * references, and a stop that does not know the answers, a newline
     * included, loses them whenever the model writes one after it. Checked
     * on every prefix of pseudo-random predictions, then the newline cases. */
    {
        const char *refs[] = {"42", "7a", "b 9"};
        const char alpha[] = "0123456789ab \n";
        uint32_t x = 12345;
        for (int t = 0; t < 300; t++) {
            char pred[64];
            const int len = 1 + t % 60;
            for (int i = 0; i < len; i++) {
                x = x * 1664525u + 1013904223u;
                pred[i] = alpha[(x >> 16) % (sizeof alpha - 1)];
            }
            pred[len] = '\0';
            double prev_all = 0, prev_part = 0;
            for (int k = 0; k <= len; k++) {
                char pre[64];
                memcpy(pre, pred, (size_t)k);
                pre[k] = '\0';
                const double a = kvs_metric_string_match_all(pre, refs, 3, NULL, 0);
                const double pt = kvs_metric_string_match_part(pre, refs, 3, NULL, 0);
                CHECK(a >= prev_all && pt >= prev_part); /* never falls as text is added */
                if (prev_all == 1.0) CHECK(a == 1.0); /* complete: stays complete */
                prev_all = a, prev_part = pt;
            }
        }
        const char *two[] = {"1234567", "7654321"};
        const char *qa[] = {"Paris"};
        /* a newline stop would keep only the first line */
        CHECK_NEAR(kvs_metric_string_match_all("1. 1234567\n2. 7654321", two, 2, NULL, 0), 1.0, 0);
        CHECK_NEAR(kvs_metric_string_match_all("1. 1234567", two, 2, NULL, 0), 0.5, 0);
        CHECK_NEAR(kvs_metric_string_match_part("The answer is in the last document.\nParis", qa, 1, NULL, 0),
                   1.0, 0);
        CHECK_NEAR(kvs_metric_string_match_part("The answer is in the last document.", qa, 1, NULL, 0), 0.0, 0);
    }

    /* lookup */
    kvs_err err = {0};
    kvs_metric_fn fn = NULL;
    CHECK_OK(kvs_metric_lookup("rouge_l", &fn, &err), &err);
    CHECK(fn == kvs_metric_rouge_l);
    const char *const *names = kvs_metric_names();
    int n = 0;
    for (; names[n]; n++) {
        fn = NULL;
        CHECK_OK(kvs_metric_lookup(names[n], &fn, &err), &err);
        CHECK(fn != NULL);
    }
    CHECK_EQ_INT(n, 8);
    CHECK_FAILS(kvs_metric_lookup("rougel", &fn, &err), KVS_ERR_NOTFOUND, &err,
                "did you mean 'rouge_l'");
    CHECK_FAILS(kvs_metric_lookup("exact", &fn, &err), KVS_ERR_NOTFOUND, &err, "exact_match");
    return kvs_test_finish("test_metrics");
}
