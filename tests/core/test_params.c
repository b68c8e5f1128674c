/*
 * test_params.c -- parameter declarations: defaults, set/get by name from text
 * for INT / FLOAT / BOOL / ENUM, formatting back to text, and every error
 * message (range, integrality, bad text, unknown name with suggestion).
 */
#include "kvsieve.h"
#include "test_util.h"

static kvs_err e_, *e = &e_;

static const kvs_param_def snap_params[] = {
    {"window", KVS_PARAM_INT, 32, 1, 4096, NULL, "observation window"},
    {"kernel", KVS_PARAM_INT, 7, 1, 63, NULL, "pooling kernel"},
    {"pool", KVS_PARAM_ENUM, 0, 0, 1, "max|avg", "pooling kind"},
};
static const kvs_method snap = {.name = "snapkv", .params = snap_params, .n_params = 3};

static const kvs_param_def toy_params[] = {
    {"gamma", KVS_PARAM_FLOAT, 0.2, 0.0, 1.0, NULL, "cutoff"},
    {"keep_sinks", KVS_PARAM_BOOL, 0, 0, 1, NULL, "sinks"},
    {"granularity", KVS_PARAM_ENUM, 1, 0, 2, "head|layer|model", "where"},
    {"seed", KVS_PARAM_INT, 7, -5, 1e9, NULL, "seed"},
};
static const kvs_method toy = {.name = "toy", .params = toy_params, .n_params = 4};
static const kvs_method bare = {.name = "full", .params = NULL, .n_params = 0};

static void test_defaults_get_set(void) {
    kvs_params p;
    kvs_params_defaults(&snap, &p);
    CHECK_EQ_INT(p.n, 3);
    CHECK(kvs_param_get(&snap, &p, "window") == 32);
    CHECK(kvs_param_get(&snap, &p, "kernel") == 7);
    CHECK(kvs_param_get(&snap, &p, "pool") == 0);
    CHECK_EQ_INT(kvs_param_index(&snap, "pool"), 2);
    CHECK_EQ_INT(kvs_param_index(&snap, "Pool"), -1);
    CHECK_EQ_INT(kvs_param_index(&snap, "nope"), -1);
    CHECK_OK(kvs_params_set(&snap, &p, "window", "64", e), e);
    CHECK(kvs_param_get(&snap, &p, "window") == 64);
    CHECK_OK(kvs_params_set(&snap, &p, "window", "4096", e), e); /* inclusive max */
    CHECK_OK(kvs_params_set(&snap, &p, "window", "1", e), e);    /* inclusive min */
    CHECK_OK(kvs_params_set(&snap, &p, "window", "16.0", e), e); /* integral value */
    CHECK(kvs_param_get(&snap, &p, "window") == 16);
    CHECK_OK(kvs_params_set(&snap, &p, "pool", "avg", e), e);
    CHECK(kvs_param_get(&snap, &p, "pool") == 1);
    CHECK_OK(kvs_params_set_kv(&snap, &p, "kernel=5", e), e);
    CHECK(kvs_param_get(&snap, &p, "kernel") == 5);

    kvs_params t;
    kvs_params_defaults(&toy, &t);
    CHECK_EQ_INT(t.n, 4);
    CHECK(kvs_param_get(&toy, &t, "gamma") == 0.2);
    CHECK(kvs_param_get(&toy, &t, "granularity") == 1);
    CHECK_OK(kvs_params_set(&toy, &t, "gamma", "0.35", e), e);
    CHECK(kvs_param_get(&toy, &t, "gamma") == 0.35);
    CHECK_OK(kvs_params_set(&toy, &t, "gamma", "1e-1", e), e);
    CHECK(kvs_param_get(&toy, &t, "gamma") == 0.1);
    CHECK_OK(kvs_params_set(&toy, &t, "keep_sinks", "true", e), e);
    CHECK(kvs_param_get(&toy, &t, "keep_sinks") == 1);
    CHECK_OK(kvs_params_set(&toy, &t, "keep_sinks", "0", e), e);
    CHECK(kvs_param_get(&toy, &t, "keep_sinks") == 0);
    CHECK_OK(kvs_params_set(&toy, &t, "keep_sinks", "1", e), e);
    CHECK(kvs_param_get(&toy, &t, "keep_sinks") == 1);
    CHECK_OK(kvs_params_set(&toy, &t, "keep_sinks", "FALSE", e), e);
    CHECK(kvs_param_get(&toy, &t, "keep_sinks") == 0);
    CHECK_OK(kvs_params_set(&toy, &t, "granularity", "model", e), e);
    CHECK(kvs_param_get(&toy, &t, "granularity") == 2);
    CHECK_OK(kvs_params_set(&toy, &t, "seed", "-5", e), e);
    CHECK(kvs_param_get(&toy, &t, "seed") == -5);
    CHECK_OK(kvs_params_set_kv(&toy, &t, "gamma=0.5", e), e);
    CHECK(kvs_param_get(&toy, &t, "gamma") == 0.5);
}

static void test_errors(void) {
    kvs_params p;
    kvs_params_defaults(&snap, &p);
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "0", e), KVS_ERR_INVALID, e,
                "method snapkv: parameter window = 0 is out of range [1, 4096]");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "4097", e), KVS_ERR_INVALID, e, "out of range [1, 4096]");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "3.5", e), KVS_ERR_INVALID, e,
                "parameter window = 3.5 is not an integer");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "abc", e), KVS_ERR_INVALID, e, "'abc' is not a number");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "", e), KVS_ERR_INVALID, e, "is not a number");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "12x", e), KVS_ERR_INVALID, e, "is not a number");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "nan", e), KVS_ERR_INVALID, e, "is not a number");
    CHECK_FAILS(kvs_params_set(&snap, &p, "window", "inf", e), KVS_ERR_INVALID, e, "is not a number");
    CHECK_FAILS(kvs_params_set(&snap, &p, "pool", "min", e), KVS_ERR_INVALID, e,
                "parameter pool = 'min' is not one of max|avg");
    CHECK_FAILS(kvs_params_set(&snap, &p, "pool", "ma", e), KVS_ERR_INVALID, e, "not one of max|avg");
    CHECK_FAILS(kvs_params_set(&snap, &p, "windw", "3", e), KVS_ERR_NOTFOUND, e,
                "method snapkv has no parameter 'windw' (did you mean 'window'?); parameters: window, kernel, pool");
    CHECK_FAILS(kvs_params_set(&snap, &p, "zzzzzzzzzz", "3", e), KVS_ERR_NOTFOUND, e,
                "method snapkv has no parameter 'zzzzzzzzzz'; parameters: window, kernel, pool");
    CHECK(strstr(e->msg, "did you mean") == NULL);
    CHECK_FAILS(kvs_params_set(&snap, &p, "Kernel", "3", e), KVS_ERR_NOTFOUND, e, "did you mean 'kernel'");
    CHECK_FAILS(kvs_params_set_kv(&snap, &p, "window", e), KVS_ERR_INVALID, e, "expected name=value");
    CHECK_FAILS(kvs_params_set_kv(&snap, &p, "=3", e), KVS_ERR_INVALID, e, "expected name=value");
    CHECK_FAILS(kvs_params_set_kv(&snap, &p, "kernal=3", e), KVS_ERR_NOTFOUND, e, "did you mean 'kernel'");
    CHECK_FAILS(kvs_params_set_kv(&snap, &p, "kernel=99", e), KVS_ERR_INVALID, e, "kernel = 99 is out of range [1, 63]");
    /* failed sets leave the value unchanged */
    CHECK(kvs_param_get(&snap, &p, "window") == 32);
    CHECK(kvs_param_get(&snap, &p, "kernel") == 7);

    kvs_params t;
    kvs_params_defaults(&toy, &t);
    CHECK_FAILS(kvs_params_set(&toy, &t, "gamma", "1.5", e), KVS_ERR_INVALID, e,
                "method toy: parameter gamma = 1.5 is out of range [0, 1]");
    CHECK_FAILS(kvs_params_set(&toy, &t, "keep_sinks", "maybe", e), KVS_ERR_INVALID, e,
                "keep_sinks = 'maybe' is not a boolean");
    CHECK_FAILS(kvs_params_set(&toy, &t, "keep_sinks", "2", e), KVS_ERR_INVALID, e, "not a boolean");
    CHECK_FAILS(kvs_params_set(&toy, &t, "seed", "1e10", e), KVS_ERR_INVALID, e, "out of range [-5, 1000000000]");
    kvs_params q;
    kvs_params_defaults(&bare, &q);
    CHECK_EQ_INT(q.n, 0);
    CHECK_FAILS(kvs_params_set(&bare, &q, "x", "1", e), KVS_ERR_NOTFOUND, e, "method full has no parameters");
    /* a parameter set made for another method is refused */
    CHECK_FAILS(kvs_params_set(&toy, &p, "gamma", "0.1", e), KVS_ERR_INVALID, e, "holds 3 values");
}

static void test_format(void) {
    char buf[64];
    kvs_param_format(&snap_params[0], 32, buf, sizeof buf);
    CHECK(strcmp(buf, "32") == 0);
    kvs_param_format(&snap_params[2], 1, buf, sizeof buf);
    CHECK(strcmp(buf, "avg") == 0);
    kvs_param_format(&snap_params[2], 0, buf, sizeof buf);
    CHECK(strcmp(buf, "max") == 0);
    kvs_param_format(&toy_params[0], 0.2, buf, sizeof buf);
    CHECK_MSG(strcmp(buf, "0.2") == 0, "%s", buf);
    kvs_param_format(&toy_params[0], 0.1 + 0.2, buf, sizeof buf); /* needs 17 digits */
    CHECK(strtod(buf, NULL) == 0.1 + 0.2);
    kvs_param_format(&toy_params[1], 1, buf, sizeof buf);
    CHECK(strcmp(buf, "true") == 0);
    kvs_param_format(&toy_params[1], 0, buf, sizeof buf);
    CHECK(strcmp(buf, "false") == 0);
    kvs_param_format(&toy_params[2], 2, buf, sizeof buf);
    CHECK(strcmp(buf, "model") == 0);
    kvs_param_format(&toy_params[3], -5, buf, sizeof buf);
    CHECK(strcmp(buf, "-5") == 0);
    char tiny[3];
    kvs_param_format(&toy_params[2], 2, tiny, sizeof tiny);
    CHECK(strcmp(tiny, "mo") == 0);
    /* format -> set round trip for every parameter of both methods */
    const kvs_method *ms[] = {&snap, &toy};
    for (int mi = 0; mi < 2; mi++) {
        kvs_params p, q;
        kvs_params_defaults(ms[mi], &p);
        kvs_params_defaults(ms[mi], &q);
        for (int i = 0; i < ms[mi]->n_params; i++) q.v[i] = -1e9;
        for (int i = 0; i < ms[mi]->n_params; i++) {
            kvs_param_format(&ms[mi]->params[i], p.v[i], buf, sizeof buf);
            CHECK_OK(kvs_params_set(ms[mi], &q, ms[mi]->params[i].name, buf, e), e);
            CHECK(q.v[i] == p.v[i]);
        }
    }
}

int main(void) {
    test_defaults_get_set();
    test_errors();
    test_format();
    return kvs_test_finish("core_params");
}
