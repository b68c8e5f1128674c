/*
 * fuzz_plan_json.c -- fuzz target for the plan JSON reader
 * (kvs_plan_from_json, formats/plan_json.c): arbitrary text in; a plan that
 * parses has passed kvs_plan_check, so every index it holds is read back.
 * Errors are expected; a crash or a sanitizer report is a bug.
 */
#include "fuzz_util.h"
#include "kvs_formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    kvs_plan p;
    kvs_err err = {0};
    if (kvs_plan_from_json(text, &p, &err) == KVS_OK) {
        kvs_err e2 = {0};
        if (kvs_plan_check(&p, &e2) != KVS_OK) abort(); /* the reader promised a checked plan */
        kvs_plan_free(&p);
    }
    free(text);
    return 0;
}
