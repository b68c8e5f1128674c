/*
 * cmd_models.c -- `kvsieve models [--json]`: the models of the registry
 * (scripts/models.tsv, embedded at build time), each with its architecture,
 * shape, size and licence, and whether it is installed (its path) or how to
 * install it. It reads no weights and downloads nothing.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvs_backend.h"

int kvs_cmd_models(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvsieve models [--json]\n"
                   "  The models --model NAME takes (default: gemma3-270m), and which are installed.\n"
                   "  Install one with scripts/install_model.sh NAME.\n");
            return 0;
        } else {
            fprintf(stderr, "kvsieve models: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (kvs_model_registry_error()) {
        fprintf(stderr, "kvsieve models: %s\n", kvs_model_registry_error());
        return 1;
    }
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("%-14s %-7s %6s %6s %9s  %-20s %s\n", "NAME", "ARCH", "LAYERS", "HEADS", "SIZE_MB", "LICENCE",
               "INSTALLED");
    for (int i = 0; i < kvs_model_registry_count(); i++) {
        const kvs_model_entry *e = kvs_model_registry_at(i);
        char path[1024];
        kvs_err err = {0};
        kvs_status st = kvs_model_installed_path(e, path, sizeof path, &err);
        char heads[32];
        snprintf(heads, sizeof heads, "%d/%d", e->n_heads, e->n_kv_heads);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", e->name);
            cJSON_AddStringToObject(o, "title", e->title);
            cJSON_AddStringToObject(o, "arch", e->arch);
            cJSON_AddNumberToObject(o, "layers", e->n_layers);
            cJSON_AddNumberToObject(o, "heads", e->n_heads);
            cJSON_AddNumberToObject(o, "kv_heads", e->n_kv_heads);
            cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
            cJSON_AddStringToObject(o, "sha256", e->sha256);
            cJSON_AddStringToObject(o, "packages", e->packages);
            cJSON_AddStringToObject(o, "licence", e->licence);
            cJSON_AddBoolToObject(o, "default", !strcmp(e->name, "gemma3-270m"));
            cJSON_AddBoolToObject(o, "installed", st == KVS_OK);
            if (st == KVS_OK) cJSON_AddStringToObject(o, "path", path);
            else cJSON_AddStringToObject(o, "problem", err.msg);
            cJSON_AddItemToArray(arr, o);
        } else {
            char how[1200];
            if (st == KVS_OK) snprintf(how, sizeof how, "%s", path);
            else if (st == KVS_ERR_NOTFOUND) snprintf(how, sizeof how, "no: scripts/install_model.sh %s", e->name);
            else snprintf(how, sizeof how, "no: %s", err.msg);
            printf("%-14s %-7s %6d %6s %9.1f  %-20s %s\n", e->name, e->arch, e->n_layers, heads, e->bytes / 1e6,
                   e->licence, how);
            printf("%-14s %s%s\n", "", e->title, strcmp(e->name, "gemma3-270m") ? "" : "; --model default");
        }
    }
    if (json) kvs_cli_print_json(arr);
    return 0;
}
