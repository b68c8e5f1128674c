/*
 * kvs_metrics.h -- scoring a model's prediction against the acceptable
 * answers of a sample (task evaluation).
 *
 * What it is: pure functions over strings. Each metric returns a value in
 * [0,1], the maximum over the answers unless said otherwise (0 when
 * n_answers is 0), or NAN when
 * memory for its scratch could not be allocated.
 *   exact_match  normalised prediction == normalised answer
 *   contains     normalised answer occurs inside the normalised prediction
 *                (on word boundaries)
 *   choice       multiple choice: the letter (A-E) or the choice text picked
 *                by the prediction equals the answer (a letter, or a choice
 *                text which is mapped to its letter through choices)
 *   rouge_l      ROUGE-L F1 over normalised word tokens (LCS, O(min) memory)
 *   needle       the needle's value appears in the prediction; a value made
 *                only of digits is compared against the digit runs of the
 *                prediction ("48,213" and "48 213" do not count, "48213" does)
 *   string_match_all   RULER's (NIAH, VT, CWE, FWE): the share of the answers
 *                that occur in the prediction, case-insensitive substring
 *                match, no normalisation (0 when there is no answer)
 *   string_match_part  RULER's (QA): 1 when any answer occurs in the
 *                prediction (same match), else 0
 *   ruler        the sample's own RULER metric (kvs_sample.metric, one of the
 *                two above); the task runner resolves it per sample, and
 *                called directly it is string_match_all
 * RULER lower-cases with Python's str.lower (Unicode); here only ASCII
 * letters are folded, so a non-ASCII answer must match in case.
 * Normalisation (SQuAD): lowercase (ASCII), drop ASCII punctuation, drop the
 * articles a/an/the, collapse whitespace. Words are whitespace-separated, so
 * text in scripts written without spaces counts one word per run.
 * What it is not: no model-based judging, no tokenizer-specific scoring.
 */
#ifndef KVS_METRICS_H
#define KVS_METRICS_H

#include <stddef.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* choices/n_choices are used by "choice" only (may be NULL/0 for others). */
typedef double (*kvs_metric_fn)(const char *prediction, const char *const *answers,
                                int n_answers, const char *const *choices, int n_choices);

double kvs_metric_exact_match(const char *prediction, const char *const *answers, int n_answers,
                              const char *const *choices, int n_choices);
double kvs_metric_contains(const char *prediction, const char *const *answers, int n_answers,
                           const char *const *choices, int n_choices);
double kvs_metric_choice(const char *prediction, const char *const *answers, int n_answers,
                         const char *const *choices, int n_choices);
double kvs_metric_rouge_l(const char *prediction, const char *const *answers, int n_answers,
                          const char *const *choices, int n_choices);
double kvs_metric_needle(const char *prediction, const char *const *answers, int n_answers,
                         const char *const *choices, int n_choices);

double kvs_metric_string_match_all(const char *prediction, const char *const *answers, int n_answers,
                                   const char *const *choices, int n_choices);
double kvs_metric_string_match_part(const char *prediction, const char *const *answers, int n_answers,
                                    const char *const *choices, int n_choices);

/* SQuAD normalisation into a new string (caller frees); NULL when out of memory. */
char *kvs_metric_normalize(const char *s);

/* The letter picked by a multiple-choice prediction: 'A'..'A'+n_choices-1 (or
 * 'A'..'E' when n_choices is 0), or 0 when none can be found. Looks for an
 * explicit "answer: B" / "(B)" / "B." / a lone "B" first, then for a unique
 * choice text inside the prediction. */
char kvs_metric_extract_choice(const char *prediction, const char *const *choices, int n_choices);

/* Metric by name: "exact_match", "contains", "choice", "rouge_l", "needle",
 * "string_match_all", "string_match_part", "ruler".
 * KVS_ERR_NOTFOUND with "did you mean" and the list otherwise. */
kvs_status kvs_metric_lookup(const char *name, kvs_metric_fn *fn, kvs_err *err);
/* NULL-terminated list of the names. */
const char *const *kvs_metric_names(void);

#ifdef __cplusplus
}
#endif
#endif
