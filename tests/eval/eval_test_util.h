/* eval_test_util.h -- helpers shared by the eval tests: a scratch folder and
 * writing a text file into it. */
#ifndef KVS_EVAL_TEST_UTIL_H
#define KVS_EVAL_TEST_UTIL_H
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* mkdtemp under /tmp; the folder name is written into dir[64]. */
static inline int eval_tmpdir(char dir[64], const char *tag) {
    snprintf(dir, 64, "/tmp/kvs-%s-XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

static inline int eval_write(const char *dir, const char *name, const char *text, char *path,
                             size_t n) {
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* rm -r of a scratch folder made by eval_tmpdir (files one level deep). */
static inline void eval_rmdir(const char *dir) {
    char cmd[256];
    if (strncmp(dir, "/tmp/kvs-", 9) != 0) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}
#endif
