/*
 * cmd_methods.c -- `kvsieve methods [--json] [--parts]`: every registered
 * method, what it needs, its parameters with type, default, range and help,
 * and for a preset its composition; then the parts a composed method may
 * name, each with its parameters. --json prints the methods as a JSON array
 * (one object per method); --json --parts prints the parts as one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvs_parts.h"
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
    if (needs & KVS_NEED_W_O) strncat(buf, "output projection W_o, ", n - strlen(buf) - 1);
    if (needs & KVS_NEED_RECON) strncat(buf, "context-reconstruction pass (engine only), ", n - strlen(buf) - 1);
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

/* One parameter: a text line, or an object appended to jp. */
static void print_param(const kvs_param_def *d, cJSON *jp, const char *indent) {
    char rng[128], def[64];
    kvs_param_format(d, d->def, def, sizeof def);
    range_text(d, rng, sizeof rng);
    if (jp) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "type", type_name(d->type));
        cJSON_AddStringToObject(o, "default", def);
        cJSON_AddStringToObject(o, "range", rng);
        cJSON_AddStringToObject(o, "help", d->help);
        cJSON_AddItemToArray(jp, o);
    } else {
        printf("%s%-14s %-5s default %-8s %-22s %s\n", indent, d->name, type_name(d->type), def, rng,
               d->help);
    }
}

/* The parts a composed method may name (kvs_parts.h). */
static int print_parts(int json) {
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("Parts (compose a method from them: --method '{\"score\":\"tova\",\"allocate\":"
               "\"pyramid\",\"keep\":{\"sinks\":4,\"window\":8},\"pick\":\"chunk\"}')\n\n");
    for (int i = 0; i < kvs_parts_count(); i++) {
        const kvs_part_info *pi = kvs_part_at(i);
        cJSON *jp = NULL;
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "kind", kvs_part_kind_name(pi->kind));
            cJSON_AddStringToObject(o, "name", pi->name);
            cJSON_AddStringToObject(o, "summary", pi->summary);
            jp = cJSON_AddArrayToObject(o, "params");
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("%-9s %s\n  %s\n", kvs_part_kind_name(pi->kind), pi->name, pi->summary);
        }
        for (int j = 0; j < pi->n_params; j++) print_param(&pi->params[j], jp, "    ");
    }
    if (json) kvs_cli_print_json(arr);
    return 0;
}

int kvs_cmd_methods(int argc, char **argv) {
    int json = 0, parts = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--parts")) parts = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvsieve methods [--json] [--parts]\n"
                   "  methods (presets with their composition), then the parts of composed methods;\n"
                   "  --json: the methods as a JSON array; --parts: the parts only\n");
            return 0;
        } else {
            fprintf(stderr, "kvsieve methods: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (parts) return print_parts(json);
    char buf[128];
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
        const kvs_composition *comp = kvs_parts_composition(m);
        if (comp) { /* a preset: its parts with its default values */
            kvs_params p;
            kvs_params_defaults(m, &p);
            char *cj = kvs_composition_json(comp, m, &p);
            if (json) cJSON_AddItemToObject(jm, "composition", cj ? cJSON_Parse(cj) : cJSON_CreateNull());
            else printf("  composition: %s\n", cj ? cj : "?");
            free(cj);
        }
        for (int j = 0; j < m->n_params; j++) print_param(&m->params[j], jp, "    ");
        if (!json) printf("\n");
    }
    if (!json) print_parts(0);
    if (json) kvs_cli_print_json(arr);
    return 0;
}
