/*
 * gnuplot.c -- finding gnuplot and quoting text for its scripts (see gnuplot.h).
 */
#include "gnuplot.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvs_gp_on_path(const char *name) {
    const char *path = getenv("PATH");
    char buf[1024];
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0 && len + strlen(name) + 2 < sizeof buf) {
            memcpy(buf, path, len);
            snprintf(buf + len, sizeof buf - len, "/%s", name);
            if (access(buf, X_OK) == 0) return 1;
        }
        path += len;
        if (*path == ':') path++;
    }
    return 0;
}

void kvs_gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}
