/*
 * part_param.c -- how a part reads its parameters from the composed method.
 *
 * What it is: kvs_part_param, a lookup by name in the composed method's one
 * flat parameter table, with the value the part documents as "absent" when
 * the preset does not declare the parameter (see kvs_parts.h). Two aliases:
 * a method that declares keep_sinks / keep_recent (FlashCache's names)
 * gives them to the readers of sinks / window.
 * What it is not: no validation of values (compose.c checks ranges once at
 * create), no defaults of its own.
 */
#include "kvs_parts.h"

#include <string.h>

/* FlashCache's spellings of the keep rules' parameters (methods/flashcache.c
 * named them before the parts existed; its preset keeps the public names). */
static const char *const aliases[][2] = {{"sinks", "keep_sinks"}, {"window", "keep_recent"}};

double kvs_part_param(const kvs_method *m, const kvs_params *p, const char *name, double absent) {
    int i = kvs_param_index(m, name);
    for (size_t a = 0; i < 0 && a < sizeof aliases / sizeof aliases[0]; a++)
        if (strcmp(aliases[a][0], name) == 0) i = kvs_param_index(m, aliases[a][1]);
    if (i < 0 || i >= p->n) return absent;
    return p->v[i];
}
