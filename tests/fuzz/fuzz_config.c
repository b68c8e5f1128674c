/*
 * fuzz_config.c -- fuzz target for the experiment config loader
 * (kvs_config_load_text, eval/config.c): the bytes are a config file's
 * text (Lua run in the loader's sandbox, then the collected tables are
 * validated in C). The target is the loader and its validation, not Lua.
 * Errors are expected; a crash, a sanitizer report or a hang is a bug.
 */
#include "fuzz_util.h"
#include "kvs_eval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (memchr(data, 0, size)) return 0; /* kvs_config_load refuses NUL bytes before this point */
    char *text = fuzz_cstr(data, size), path[128];
    snprintf(path, sizeof path, "%s/fuzz.lua", fuzz_tmpdir());
    kvs_config cfg;
    kvs_err err = {0};
    if (kvs_config_load_text(path, text, NULL, 0, &cfg, &err) == KVS_OK) kvs_config_free(&cfg);
    free(text);
    return 0;
}
