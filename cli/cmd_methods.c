/*
 * cmd_methods.c -- `kvsieve methods [--json]`: every registered method, what
 * it needs, and its parameters with type, default, range and help.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvsieve_methods.h"

static const char *type_name(kvs_param_type t) {
    switch (t) {
    case KVS_PARAM_INT: return "int";
    case KVS_PARAM_FLOAT: return "float";
    case KVS_PARAM_BOOL: return "bool";
    case KVS_PARAM_ENUM: return "enum";
    }
    return "?";
}

static void needs_text(unsigned needs, char *buf, size_t n) {
    buf[0] = 0;
    if (needs & KVS_NEED_Q_ALL) strncat(buf, "all queries, ", n - strlen(buf) - 1);
    if (needs & KVS_NEED_Q_WINDOW) strncat(buf, "window queries, ", n - strlen(buf) - 1);
    if (needs & KVS_NEED_MODALITY) strncat(buf, "modality mask, ", n - strlen(buf) - 1);
    size_t l = strlen(buf);
    if (l >= 2) buf[l - 2] = 0;
    else snprintf(buf, n, "K and V only");
}

static void range_text(const kvs_param_def *d, char *buf, size_t n) {
    switch (d->type) {
    case KVS_PARAM_INT: snprintf(buf, n, "[%.0f, %.0f]", d->min, d->max); break;
    case KVS_PARAM_FLOAT: snprintf(buf, n, "[%g, %g]", d->min, d->max); break;
    case KVS_PARAM_BOOL: snprintf(buf, n, "true|false"); break;
    case KVS_PARAM_ENUM: snprintf(buf, n, "%s", d->choices); break;
    }
}

int kvs_cmd_methods(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvsieve methods [--json]\n");
            return 0;
        } else {
            fprintf(stderr, "kvsieve methods: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    char buf[128], rng[128], def[64];
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    for (int i = 0; i < kvs_methods_count(); i++) {
        const kvs_method *m = kvs_method_at(i);
        needs_text(m->needs, buf, sizeof buf);
        cJSON *jm = NULL, *jp = NULL;
        if (json) {
            jm = cJSON_CreateObject();
            cJSON_AddStringToObject(jm, "name", m->name);
            cJSON_AddStringToObject(jm, "summary", m->summary);
            cJSON_AddStringToObject(jm, "needs", buf);
            jp = cJSON_AddArrayToObject(jm, "params");
            cJSON_AddItemToArray(arr, jm);
        } else {
            printf("%s\n  %s\n  needs: %s\n", m->name, m->summary, buf);
        }
        for (int j = 0; j < m->n_params; j++) {
            const kvs_param_def *d = &m->params[j];
            kvs_param_format(d, d->def, def, sizeof def);
            range_text(d, rng, sizeof rng);
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "name", d->name);
                cJSON_AddStringToObject(o, "type", type_name(d->type));
                cJSON_AddStringToObject(o, "default", def);
                cJSON_AddStringToObject(o, "range", rng);
                cJSON_AddStringToObject(o, "help", d->help);
                cJSON_AddItemToArray(jp, o);
            } else {
                printf("    %-14s %-5s default %-8s %-22s %s\n", d->name, type_name(d->type), def, rng, d->help);
            }
        }
        if (!json) printf("\n");
    }
    if (json) {
        char *text = cJSON_Print(arr);
        if (text) puts(text);
        cJSON_free(text);
        cJSON_Delete(arr);
    }
    return 0;
}
