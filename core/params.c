/*
 * params.c -- method parameters: defaults, parsing from text, formatting.
 *
 * What it is: the one validator of kvs_param_def declarations. Every value
 * that reaches a method passed through kvs_params_set (CLI, Lua, HTTP, DB).
 * Errors name the method, the parameter and the allowed values, and suggest
 * the closest parameter name for a typo.
 * What it is not: it does not know any method; ranges live in the methods.
 */
#include "kvsieve.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void kvs_params_defaults(const kvs_method *m, kvs_params *out) {
    assert(m && out);
    assert(m->n_params >= 0 && m->n_params <= KVS_MAX_PARAMS);
    memset(out, 0, sizeof *out);
    out->n = m->n_params;
    for (int i = 0; i < m->n_params; i++) out->v[i] = m->params[i].def;
}

int kvs_param_index(const kvs_method *m, const char *name) {
    if (!m || !name) return -1;
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

double kvs_param_get(const kvs_method *m, const kvs_params *p, const char *name) {
    int i = kvs_param_index(m, name);
    assert(i >= 0 && "kvs_param_get: unknown parameter name");
    assert(p && i < p->n);
    return p->v[i];
}


/* Number of the i-th "|"-separated choice equal to s, or -1; *count gets the
 * number of choices. */
static int enum_lookup(const char *choices, const char *s, int *count) {
    int idx = 0, found = -1;
    size_t ls = strlen(s);
    const char *c = choices ? choices : "";
    for (;;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (found < 0 && len == ls && strncmp(c, s, len) == 0) found = idx;
        idx++;
        if (!bar) break;
        c = bar + 1;
    }
    if (count) *count = idx;
    return found;
}

/* Copy the i-th choice into buf; returns 0 if there is none. */
static int enum_name(const char *choices, int i, char *buf, size_t n) {
    const char *c = choices ? choices : "";
    for (int k = 0;; k++) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (k == i) {
            snprintf(buf, n, "%.*s", (int)len, c);
            return 1;
        }
        if (!bar) return 0;
        c = bar + 1;
    }
}

/* Shortest of %.15g / %.17g that reads back exactly: 0.2 -> "0.2". */
static void short_num(double v, char *buf, size_t n) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v && !isnan(v)) snprintf(tmp, sizeof tmp, "%.17g", v);
    snprintf(buf, n, "%s", tmp);
}

/* Parse a whole string as a finite double. */
static int parse_double(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s)) return 0;
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

kvs_status kvs_params_set(const kvs_method *m, kvs_params *p, const char *name, const char *value,
                          kvs_err *err) {
    if (!m || !p || !name || !value)
        return kvs_errorf(err, KVS_ERR_INVALID, "kvs_params_set: NULL argument");
    const char *mn = m->name ? m->name : "?";
    int i = kvs_param_index(m, name);
    if (i < 0) {
        if (m->n_params == 0)
            return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s has no parameters (got '%s')", mn,
                              name);
        char list[400] = "";
        size_t used = 0;
        int best = -1, best_d = 1000;
        for (int j = 0; j < m->n_params; j++) {
            int dj = kvs_edit_distance(name, m->params[j].name);
            if (dj < best_d) {
                best_d = dj;
                best = j;
            }
            int w = snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "", m->params[j].name);
            if (w > 0) used += (size_t)w < sizeof list - used ? (size_t)w : sizeof list - used - 1;
        }
        size_t ln = strlen(name);
        int close = best >= 0 && (best_d <= 2 || (size_t)best_d * 3 <= ln);
        if (close)
            return kvs_errorf(err, KVS_ERR_NOTFOUND,
                              "method %s has no parameter '%s' (did you mean '%s'?); parameters: %s",
                              mn, name, m->params[best].name, list);
        return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s has no parameter '%s'; parameters: %s", mn,
                          name, list);
    }
    if (p->n != m->n_params)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "method %s: parameter set holds %d values but the method declares %d "
                          "(start from kvs_params_defaults)",
                          mn, p->n, m->n_params);
    const kvs_param_def *d = &m->params[i];
    double x = 0.0;
    switch (d->type) {
    case KVS_PARAM_INT:
    case KVS_PARAM_FLOAT:
        if (!parse_double(value, &x))
            return kvs_errorf(err, KVS_ERR_INVALID, "method %s: parameter %s = '%s' is not a number", mn,
                              d->name, value);
        if (d->type == KVS_PARAM_INT && x != floor(x))
            return kvs_errorf(err, KVS_ERR_INVALID, "method %s: parameter %s = %s is not an integer", mn,
                              d->name, value);
        if (x < d->min || x > d->max) {
            char lo[64], hi[64];
            short_num(d->min, lo, sizeof lo);
            short_num(d->max, hi, sizeof hi);
            return kvs_errorf(err, KVS_ERR_INVALID, "method %s: parameter %s = %s is out of range [%s, %s]",
                              mn, d->name, value, lo, hi);
        }
        break;
    case KVS_PARAM_BOOL:
        if (strcasecmp(value, "true") == 0 || strcmp(value, "1") == 0) x = 1.0;
        else if (strcasecmp(value, "false") == 0 || strcmp(value, "0") == 0) x = 0.0;
        else
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "method %s: parameter %s = '%s' is not a boolean (true, false, 1, 0)", mn,
                              d->name, value);
        break;
    case KVS_PARAM_ENUM: {
        int k = enum_lookup(d->choices, value, NULL);
        if (k < 0)
            return kvs_errorf(err, KVS_ERR_INVALID, "method %s: parameter %s = '%s' is not one of %s", mn,
                              d->name, value, d->choices ? d->choices : "(no choices)");
        x = (double)k;
        break;
    }
    default:
        return kvs_errorf(err, KVS_ERR_INTERNAL, "method %s: parameter %s has unknown type %d", mn,
                          d->name, (int)d->type);
    }
    p->v[i] = x;
    return KVS_OK;
}

kvs_status kvs_params_set_kv(const kvs_method *m, kvs_params *p, const char *kv, kvs_err *err) {
    if (!kv) return kvs_errorf(err, KVS_ERR_INVALID, "kvs_params_set_kv: NULL argument");
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return kvs_errorf(err, KVS_ERR_INVALID, "method %s: expected name=value, got '%s'",
                          m && m->name ? m->name : "?", kv);
    char name[64];
    size_t len = (size_t)(eq - kv);
    if (len >= sizeof name)
        return kvs_errorf(err, KVS_ERR_NOTFOUND, "method %s: parameter name '%.*s...' is too long",
                          m && m->name ? m->name : "?", 32, kv);
    memcpy(name, kv, len);
    name[len] = '\0';
    return kvs_params_set(m, p, name, eq + 1, err);
}

void kvs_param_format(const kvs_param_def *d, double v, char *buf, size_t n) {
    if (!buf || n == 0) return;
    if (!d) {
        snprintf(buf, n, "%.17g", v);
        return;
    }
    switch (d->type) {
    case KVS_PARAM_INT:
        snprintf(buf, n, "%.0f", v);
        return;
    case KVS_PARAM_BOOL:
        snprintf(buf, n, "%s", v != 0.0 ? "true" : "false");
        return;
    case KVS_PARAM_ENUM: {
        int k = (int)v;
        if ((double)k == v && k >= 0 && enum_name(d->choices, k, buf, n)) return;
        snprintf(buf, n, "%.17g", v); /* not a valid choice index: show the raw value */
        return;
    }
    case KVS_PARAM_FLOAT:
    default:
        short_num(v, buf, n);
        return;
    }
}
