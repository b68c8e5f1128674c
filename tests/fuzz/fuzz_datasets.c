/*
 * fuzz_datasets.c -- fuzz target for the dataset file loaders
 * (datasets/loaders.c): the first byte picks the loader (JSONL QA,
 * LongBench JSONL, MileBench task JSON), the rest is the file. A dataset
 * that loads is rendered to its canonical text (every field read).
 * Errors are expected; a crash or a sanitizer report is a bug. Two image
 * files exist for MileBench samples to name: images/a.png and images/b.png
 * next to the task file (loaded and hashed at load time).
 */
#include "fuzz_util.h"
#include "kvs_datasets.h"

#include <sys/stat.h>

static char img_dir[128], img_a[160], img_b[160];

static void remove_images(void) {
    remove(img_a);
    remove(img_b);
    rmdir(img_dir);
}

static void make_images(void) {
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    snprintf(img_dir, sizeof img_dir, "%s/images", fuzz_tmpdir());
    if (mkdir(img_dir, 0700)) abort();
    snprintf(img_a, sizeof img_a, "%s/a.png", img_dir);
    snprintf(img_b, sizeof img_b, "%s/b.png", img_dir);
    const char *files[2] = {img_a, img_b};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "wb");
        if (!f || fwrite(png, 1, sizeof png - (size_t)i, f) != sizeof png - (size_t)i || fclose(f)) abort();
    }
    atexit(remove_images); /* runs before the folder's own removal */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const kinds[3] = {"jsonl", "longbench", "milebench"};
    static const char *const names[3] = {"in.jsonl", "in_lb.jsonl", "task.json"};
    if (!img_dir[0]) make_images();
    if (size < 1) return 0;
    int k = data[0] % 3;
    char path[128];
    fuzz_write(names[k], data + 1, size - 1, path, sizeof path);
    kvs_dataset *d = NULL;
    kvs_err err = {0};
    if (kvs_dataset_load(kinds[k], path, fuzz_hash, &d, &err) == KVS_OK) {
        char *text = NULL;
        size_t n = 0;
        if (kvs_dataset_canonical(d, &text, &n, &err) == KVS_OK) free(text);
        kvs_dataset_free(d);
    }
    remove(path);
    return 0;
}
