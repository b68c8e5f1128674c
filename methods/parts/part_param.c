/*
 * part_param.c -- how a part reads its parameters from the composed method.
 *
 * What it is: kvs_part_param, a lookup by name in the composed method's one
 * flat parameter table, with the value the part documents as "absent" when
 * the preset does not declare the parameter (see kvs_parts.h).
 * What it is not: no validation of values (compose.c checks ranges once at
 * create), no defaults of its own.
 */
#include "kvs_parts.h"

double kvs_part_param(const kvs_method *m, const kvs_params *p, const char *name, double absent) {
    const int i = kvs_param_index(m, name);
    if (i < 0 || i >= p->n) return absent;
    return p->v[i];
}
