/*
 * fuzz_util.h -- what the fuzz harnesses share: a private temporary folder
 * for parsers that read a path (removed at exit), writing an input there,
 * a NUL-terminated copy of an input, and a cheap stand-in for the datasets'
 * SHA-256 (a digest's quality does not matter to a parser).
 * Not a harness; header-only so each harness stays one file plus a driver.
 */
#ifndef KVS_FUZZ_UTIL_H
#define KVS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_[64];

static inline void fuzz_rmdir_(void) {
    if (fuzz_dir_[0]) rmdir(fuzz_dir_);
}

/* The folder, created on first use (a harness removes its files itself). */
static inline const char *fuzz_tmpdir(void) {
    if (!fuzz_dir_[0]) {
        strcpy(fuzz_dir_, "/tmp/kvs-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir_)) abort();
        atexit(fuzz_rmdir_);
    }
    return fuzz_dir_;
}

/* Write data to dir/name; the full path goes to path[n]. */
static inline void fuzz_write(const char *name, const uint8_t *data, size_t size, char *path, size_t n) {
    snprintf(path, n, "%s/%s", fuzz_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
}

/* malloc'd copy with a NUL after the last byte (caller frees). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* FNV-1a as 64 hex digits (the kvs_ds_hash_fn signature). */
static inline void fuzz_hash(const void *data, size_t n, char out[65]) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)data)[i]) * 1099511628211ULL;
    for (int i = 0; i < 4; i++) snprintf(out + 16 * i, 17, "%016llx", (unsigned long long)(h + (uint64_t)i));
}

#endif
