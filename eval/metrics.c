/*
 * metrics.c -- task metrics: exact match, contains, multiple-choice
 * extraction accuracy, ROUGE-L F1, needle accuracy and RULER's
 * string_match_all / string_match_part, with SQuAD-style
 * normalisation and a lookup by name (see kvs_metrics.h).
 * Not here: aggregation over samples or confidence intervals (report.c),
 * anything model-based. Pure functions: no global state; scratch is O(length
 * of the strings), ROUGE-L keeps one DP row (O(answer tokens)).
 */
#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvs_metrics.h"

static int is_article(const char *w, size_t n) {
    return (n == 1 && w[0] == 'a') || (n == 2 && !strncmp(w, "an", 2)) ||
           (n == 3 && !strncmp(w, "the", 3));
}

char *kvs_metric_normalize(const char *s) {
    size_t n = strlen(s);
    char *low = malloc(n + 1); /* [n+1] lowercased, punctuation removed */
    char *out = malloc(n + 1); /* [n+1] */
    if (!low || !out) {
        free(low);
        free(out);
        return NULL;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 128 && ispunct(c)) continue;
        low[m++] = (char)(c < 128 ? tolower(c) : c);
    }
    low[m] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < m;) {
        while (i < m && isspace((unsigned char)low[i])) i++;
        size_t st = i;
        while (i < m && !isspace((unsigned char)low[i])) i++;
        if (i == st || is_article(low + st, i - st)) continue;
        if (o) out[o++] = ' ';
        memcpy(out + o, low + st, i - st);
        o += i - st;
    }
    out[o] = '\0';
    free(low);
    return out;
}

/* needle occurs in hay starting and ending on word (space/string) boundaries. */
static int contains_words(const char *hay, const char *needle) {
    size_t nl = strlen(needle);
    if (nl == 0) return hay[0] == '\0';
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
        int left = p == hay || p[-1] == ' ';
        int right = p[nl] == '\0' || p[nl] == ' ';
        if (left && right) return 1;
    }
    return 0;
}

static int same_text(const char *p, const char *a) { return strcmp(a, p) == 0; }

/* 1 if match(normalised prediction, normalised answer) holds for some answer,
 * else 0; NAN when memory runs out. */
static double any_answer(const char *prediction, const char *const *answers, int n_answers,
                         int (*match)(const char *p, const char *a)) {
    char *p = kvs_metric_normalize(prediction);
    if (!p) return NAN;
    double best = 0.0;
    for (int i = 0; i < n_answers && best < 1.0; i++) {
        char *a = kvs_metric_normalize(answers[i]);
        if (!a) {
            best = NAN;
            break;
        }
        if (match(p, a)) best = 1.0;
        free(a);
    }
    free(p);
    return best;
}

double kvs_metric_exact_match(const char *prediction, const char *const *answers, int n_answers,
                              const char *const *choices, int n_choices) {
    return any_answer(prediction, answers, n_answers, same_text);
}

double kvs_metric_contains(const char *prediction, const char *const *answers, int n_answers,
                           const char *const *choices, int n_choices) {
    return any_answer(prediction, answers, n_answers, contains_words);
}

/* ---- multiple choice ------------------------------------------------------ */

static int in_range(char c, char last) { return c >= 'A' && c <= last; }
static int delim(char c) { return c == '\0' || c == '.' || c == ')' || c == ':' || c == ',' || isspace((unsigned char)c); }

char kvs_metric_extract_choice(const char *prediction, const char *const *choices, int n_choices) {
    char last = n_choices > 0 ? (char)('A' + (n_choices > 26 ? 25 : n_choices - 1)) : 'E';
    const char *p = prediction;
    size_t n = strlen(p);
    /* 1. "answer is B", "answer: (B)", "Answer - B" */
    for (size_t i = 0; i + 6 <= n; i++) {
        if (strncasecmp(p + i, "answer", 6)) continue;
        const char *q = p + i + 6;
        while (*q == ' ' || *q == ':' || *q == '-' || *q == '*') q++;
        if (!strncasecmp(q, "is", 2) && !isalpha((unsigned char)q[2])) q += 2;
        while (*q == ' ' || *q == ':' || *q == '(' || *q == '*') q++;
        if (in_range(*q, last) && delim(q[1])) return *q;
    }
    /* 2. a leading letter: "B", "B.", "(B)", "B) text" */
    const char *q = p;
    while (isspace((unsigned char)*q) || *q == '(' || *q == '*') q++;
    if (in_range(*q, last) && (q[1] == '\0' || q[1] == '.' || q[1] == ')' || q[1] == ':' ||
                               (isspace((unsigned char)q[1]) && (q[2] == '\0' || isspace((unsigned char)q[2])))))
        return *q;
    /* 3. "(B)" anywhere */
    for (size_t i = 0; i + 3 <= n; i++)
        if (p[i] == '(' && in_range(p[i + 1], last) && p[i + 2] == ')') return p[i + 1];
    /* 4. a lone capital letter ending the prediction: "... so B" / "... is B." */
    size_t e = n;
    while (e > 0 && (isspace((unsigned char)p[e - 1]) || p[e - 1] == '.')) e--;
    if (e >= 1 && in_range(p[e - 1], last) && (e == 1 || isspace((unsigned char)p[e - 2]))) return p[e - 1];
    /* 5. exactly one choice text inside the prediction */
    if (n_choices <= 0) return 0;
    char *np = kvs_metric_normalize(p);
    if (!np) return 0;
    char found = 0;
    int hits = 0;
    for (int i = 0; i < n_choices && i < 26; i++) {
        char *c = kvs_metric_normalize(choices[i]);
        if (!c) break;
        if (c[0] && contains_words(np, c)) {
            hits++;
            found = (char)('A' + i);
        }
        free(c);
    }
    free(np);
    return hits == 1 ? found : 0;
}

/* The letter an answer stands for: "B", "(B)", "b." or a choice's text. */
static char answer_letter(const char *a, const char *const *choices, int n_choices) {
    const char *q = a;
    while (isspace((unsigned char)*q) || *q == '(') q++;
    char c = (char)toupper((unsigned char)*q);
    if (c >= 'A' && c <= 'Z') {
        const char *r = q + 1;
        while (*r == ')' || *r == '.' || isspace((unsigned char)*r)) r++;
        if (*r == '\0') return c;
    }
    char *na = kvs_metric_normalize(a);
    if (!na) return 0;
    char found = 0;
    for (int i = 0; i < n_choices && i < 26 && !found; i++) {
        char *nc = kvs_metric_normalize(choices[i]);
        if (!nc) break;
        if (!strcmp(na, nc)) found = (char)('A' + i);
        free(nc);
    }
    free(na);
    return found;
}

double kvs_metric_choice(const char *prediction, const char *const *answers, int n_answers,
                         const char *const *choices, int n_choices) {
    char got = kvs_metric_extract_choice(prediction, choices, n_choices);
    if (!got) return 0.0;
    for (int i = 0; i < n_answers; i++)
        if (answer_letter(answers[i], choices, n_choices) == got) return 1.0;
    return 0.0;
}

/* ---- ROUGE-L ---------------------------------------------------------------- */

/* Split a normalised string in place into words; returns the count. */
static int split_words(char *s, char **words /* [strlen(s)/2+1] */) {
    int n = 0;
    for (char *p = s; *p;) {
        words[n++] = p;
        char *sp = strchr(p, ' ');
        if (!sp) break;
        *sp = '\0';
        p = sp + 1;
    }
    return n;
}

static double rouge_l_one(const char *pred_norm, const char *ans, int *oom) {
    char *a = kvs_metric_normalize(ans);
    char *p = malloc(strlen(pred_norm) + 1);
    char **pw = NULL, **aw = NULL;
    int *row = NULL;
    double f = 0.0;
    if (!a || !p) goto oom;
    strcpy(p, pred_norm);
    pw = malloc((strlen(p) / 2 + 1) * sizeof *pw); /* [prediction words] */
    aw = malloc((strlen(a) / 2 + 1) * sizeof *aw); /* [answer words] */
    if (!pw || !aw) goto oom;
    int np = split_words(p, pw), na = split_words(a, aw);
    if (np == 0 || na == 0) goto cleanup;
    row = calloc((size_t)na + 1, sizeof *row); /* [na+1] one DP row over answer words */
    if (!row) goto oom;
    for (int i = 1; i <= np; i++) {
        int diag = 0; /* L[i-1][j-1] */
        for (int j = 1; j <= na; j++) {
            int up = row[j]; /* L[i-1][j] */
            row[j] = !strcmp(pw[i - 1], aw[j - 1]) ? diag + 1 : (up > row[j - 1] ? up : row[j - 1]);
            diag = up;
        }
    }
    int lcs = row[na];
    if (lcs > 0) {
        double prec = (double)lcs / np, rec = (double)lcs / na;
        f = 2.0 * prec * rec / (prec + rec);
    }
    goto cleanup;
oom:
    *oom = 1;
cleanup:
    free(row);
    free(pw);
    free(aw);
    free(p);
    free(a);
    return f;
}

double kvs_metric_rouge_l(const char *prediction, const char *const *answers, int n_answers,
                          const char *const *choices, int n_choices) {
    char *p = kvs_metric_normalize(prediction);
    if (!p) return NAN;
    double best = 0.0;
    int oom = 0;
    for (int i = 0; i < n_answers && !oom; i++) {
        double f = rouge_l_one(p, answers[i], &oom);
        if (f > best) best = f;
    }
    free(p);
    return oom ? NAN : best;
}

/* ---- needle ------------------------------------------------------------------ */

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

static int has_digit_run(const char *pred, const char *digits) {
    size_t dl = strlen(digits);
    for (const char *p = pred; *p;) {
        if (!isdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        const char *s = p;
        while (isdigit((unsigned char)*p)) p++;
        if ((size_t)(p - s) == dl && !strncmp(s, digits, dl)) return 1;
    }
    return 0;
}

double kvs_metric_needle(const char *prediction, const char *const *answers, int n_answers,
                         const char *const *choices, int n_choices) {
    double best = 0.0;
    for (int i = 0; i < n_answers && best < 1.0; i++) {
        const char *a = answers[i];
        while (isspace((unsigned char)*a)) a++;
        size_t al = strlen(a);
        while (al > 0 && isspace((unsigned char)a[al - 1])) al--;
        char trimmed[128];
        if (al < sizeof trimmed) {
            memcpy(trimmed, a, al);
            trimmed[al] = '\0';
            if (all_digits(trimmed)) {
                if (has_digit_run(prediction, trimmed)) best = 1.0;
                continue;
            }
        }
        double c = kvs_metric_contains(prediction, &answers[i], 1, NULL, 0);
        if (isnan(c)) return NAN;
        if (c > best) best = c;
    }
    return best;
}

/* ---- RULER ------------------------------------------------------------------- */

/* r.lower() in pred.lower(): ASCII letters folded, other bytes compared as
 * they are. */
static int contains_ci(const char *hay, const char *needle) {
    size_t nl = strlen(needle), hl = strlen(hay);
    if (nl == 0) return 1;
    for (size_t i = 0; i + nl <= hl; i++)
        if (!strncasecmp(hay + i, needle, nl)) return 1;
    return 0;
}

double kvs_metric_string_match_all(const char *prediction, const char *const *answers, int n_answers,
                                   const char *const *choices, int n_choices) {
    if (n_answers <= 0) return 0.0;
    int hit = 0;
    for (int i = 0; i < n_answers; i++) hit += contains_ci(prediction, answers[i]);
    return (double)hit / n_answers;
}

double kvs_metric_string_match_part(const char *prediction, const char *const *answers, int n_answers,
                                    const char *const *choices, int n_choices) {
    for (int i = 0; i < n_answers; i++)
        if (contains_ci(prediction, answers[i])) return 1.0;
    return 0.0;
}

/* ---- lookup ------------------------------------------------------------------ */

static const char *const metric_names[] = {"exact_match", "contains",          "choice",
                                           "rouge_l",     "needle",            "string_match_all",
                                           "string_match_part", "ruler",       NULL};
static const kvs_metric_fn metric_fns[] = {kvs_metric_exact_match,      kvs_metric_contains,
                                           kvs_metric_choice,           kvs_metric_rouge_l,
                                           kvs_metric_needle,           kvs_metric_string_match_all,
                                           kvs_metric_string_match_part, kvs_metric_string_match_all};

const char *const *kvs_metric_names(void) { return metric_names; }

kvs_status kvs_metric_lookup(const char *name, kvs_metric_fn *fn, kvs_err *err) {
    int best = -1, bd = 1 << 30;
    for (int i = 0; metric_names[i]; i++) {
        if (name && !strcmp(name, metric_names[i])) {
            *fn = metric_fns[i];
            return KVS_OK;
        }
        int d = kvs_edit_distance(name ? name : "", metric_names[i]);
        if (d < bd) {
            bd = d;
            best = i;
        }
    }
    assert(best >= 0);
    return kvs_errorf(err, KVS_ERR_NOTFOUND,
                      "unknown metric '%s' (did you mean '%s'?); metrics: exact_match, contains, "
                      "choice, rouge_l, needle, string_match_all, string_match_part, ruler",
                      name ? name : "(null)", metric_names[best]);
}
