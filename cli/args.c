/*
 * args.c -- small, strict parsers for command-line values. Every failure
 * prints which flag was wrong and what was expected.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int kvs_arg_int(const char *flag, const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno) {
        fprintf(stderr, "kvsieve: %s expects an integer, got '%s'\n", flag, text ? text : "");
        return 1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "kvsieve: %s = %ld is out of range [%ld, %ld]\n", flag, v, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

int kvs_arg_double(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v)) {
        fprintf(stderr, "kvsieve: %s expects a number, got '%s'\n", flag, text ? text : "");
        return 1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "kvsieve: %s = %g is out of range [%g, %g]\n", flag, v, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

const char *kvs_arg_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvsieve: %s needs a value\n", argv[*i]);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

int kvs_arg_budget(const char *flag, const char *text, kvs_budget *b, int *ratio_given, int *tokens_given) {
    /* Wide ranges on purpose: core's kvs_budget_per_layer says what is allowed. */
    if (!strcmp(flag, "--ratio")) {
        *ratio_given = 1;
        return kvs_arg_double(flag, text, -1e300, 1e300, &b->ratio);
    }
    long t = 0;
    *tokens_given = 1;
    int bad = kvs_arg_int(flag, text, -0x7fffffffL, 0x7fffffffL, &t);
    b->tokens = t;
    return bad;
}
