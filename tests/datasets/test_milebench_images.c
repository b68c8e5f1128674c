/*
 * test_milebench_images.c -- the MileBench loader's images on a tiny task
 * written here (three few-byte "PNG" files): {image#k} / {table#k}
 * placeholders become media markers in order (an image used twice is sent
 * twice, unreferenced images go first), files resolve against images/ or
 * the task's folder (absolute paths as is), kvs_sample_read_image returns
 * the bytes and refuses changed ones, the dataset hash follows the image
 * bytes (not the folder they were found in), and the errors: a placeholder
 * out of range, a missing file, a file over 64 MiB (sparse, ftruncate), the
 * marker as text, a placeholder in a choice. Each names the task file, the
 * sample and k or the path.
 * Not here: requests (tests/task/test_task_images.c).
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "test_util.h"

static char dir[64];

static void put(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void puts_file(const char *path, const char *text) { put(path, text, strlen(text)); }

/* Three distinct tiny "images": the PNG signature and a tag byte. */
static const unsigned char IMG[3][10] = {
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x00, 'a'},
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x01, 'b'},
    {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x02, 'c'},
};

static const char *TASK =
    "{\"meta_data\": {\"task\": \"t\", \"question_type\": \"open-ended\", \"task_instruction\": [\"Describe.\"]},\n"
    " \"data\": [\n"
    "  {\"sample_id\": \"a\", \"task_instance\": {\"context\": \"Look {image#2} and {image#1}, again {image#2}.\",\n"
    "   \"images_path\": [\"p1.png\", \"p2.png\", \"p3.png\"]}, \"response\": \"x\"},\n"
    "  {\"sample_id\": \"b\", \"task_instance\": {\"context\": \"No images; {image#x} is text.\", \"images_path\": []},\n"
    "   \"response\": \"y\"},\n"
    "  {\"sample_id\": \"c\", \"task_instance\": {\"context\": \"A table {table#1}.\", \"images_path\": [\"p3.png\"]},\n"
    "   \"response\": \"z\"}\n"
    " ]}\n";

#define M KVS_MEDIA_MARKER

/* Load `text` written as <folder>/<name>; expect failure with code and words. */
static void fails(const char *folder, const char *name, const char *text, kvs_status code, const char *w1,
                  const char *w2, const char *w3) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", folder, name);
    puts_file(p, text);
    kvs_err err = {0};
    kvs_dataset *d = NULL;
    kvs_status st = kvs_dataset_load_milebench(p, kvs_sha256_hex, &d, &err);
    CHECK_MSG(st == code && !d && strstr(err.msg, p) && strstr(err.msg, w1) && (!w2 || strstr(err.msg, w2)) &&
                  (!w3 || strstr(err.msg, w3)),
              "%s: got %d \"%s\", want %d with the path, \"%s\", \"%s\", \"%s\"", name, (int)st, err.msg, (int)code,
              w1, w2 ? w2 : "", w3 ? w3 : "");
    kvs_dataset_free(d);
    unlink(p);
}

int main(void) {
    kvs_err err = {0};
    char p[512], task[256], imgdir[256], flat[256];
    snprintf(dir, sizeof dir, "/tmp/kvs-mbimg-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* MileBench's layout: <task folder>/images/ */
    snprintf(imgdir, sizeof imgdir, "%s/images", dir);
    mkdir(imgdir, 0700);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/p%d.png", imgdir, i + 1);
        put(p, IMG[i], sizeof IMG[i]);
    }
    snprintf(task, sizeof task, "%s/T.json", dir);
    puts_file(task, TASK);
    kvs_dataset *d = NULL;
    CHECK_OK(kvs_dataset_load_milebench(task, kvs_sha256_hex, &d, &err), &err);
    char hash1[65] = "";
    if (d) {
        snprintf(hash1, sizeof hash1, "%s", d->hash);
        CHECK(!strcmp(d->version, "milebench-2"));
        const kvs_sample *s = &d->samples[0];
        /* p3 is referenced by no placeholder: it goes first */
        CHECK_MSG(!strcmp(s->context, M "Look " M " and " M ", again " M "."), "%s", s->context);
        CHECK_EQ_INT(s->n_media, 4);
        int want[4] = {2, 1, 0, 1};
        for (int k = 0; k < 4 && k < s->n_media; k++) CHECK_EQ_INT(s->media[k], want[k]);
        CHECK_EQ_INT(s->n_images, 3);
        CHECK(!strcmp(s->images[0], "p1.png")); /* as written */
        snprintf(p, sizeof p, "%s/p1.png", imgdir);
        CHECK_MSG(!strcmp(s->image_files[0], p), "%s", s->image_files[0]);
        for (int i = 0; i < 3; i++) {
            char h[65];
            kvs_sha256_hex(IMG[i], sizeof IMG[i], h);
            CHECK(!strcmp(s->image_sha256[i], h));
            unsigned char *bytes = NULL;
            size_t n = 0;
            CHECK_OK(kvs_sample_read_image(d, s, i, kvs_sha256_hex, &bytes, &n, &err), &err);
            CHECK(n == sizeof IMG[i] && bytes && !memcmp(bytes, IMG[i], n));
            free(bytes);
        }
        unsigned char *bytes = NULL;
        size_t n = 0;
        CHECK_FAILS(kvs_sample_read_image(d, s, 3, kvs_sha256_hex, &bytes, &n, &err), KVS_ERR_INVALID, &err,
                    "sample 'a'");
        /* a text sample keeps its text ({image#x} is no placeholder) and has no media */
        s = &d->samples[1];
        CHECK(!strcmp(s->context, "No images; {image#x} is text."));
        CHECK(s->n_media == 0 && !s->media && !s->image_files && !kvs_sample_has_images(s));
        /* {table#k} is MileBench's other spelling of the same placeholder */
        s = &d->samples[2];
        CHECK_MSG(!strcmp(s->context, "A table " M "."), "%s", s->context);
        CHECK(s->n_media == 1 && s->media[0] == 0);
        /* the bytes changed after loading: refused, naming sample and file */
        snprintf(p, sizeof p, "%s/p3.png", imgdir);
        unsigned char changed[10];
        memcpy(changed, IMG[2], sizeof changed);
        changed[9] = 'C';
        put(p, changed, sizeof changed);
        CHECK_FAILS(kvs_sample_read_image(d, s, 0, kvs_sha256_hex, &bytes, &n, &err), KVS_ERR_IO, &err,
                    "changed since the task was loaded");
        CHECK(strstr(err.msg, "sample 'c'") && strstr(err.msg, p));
        CHECK(bytes == NULL);
        /* the canonical text of a text-only sample has no image lines */
        char *canon = NULL;
        size_t cl = 0;
        CHECK_OK(kvs_dataset_canonical(d, &canon, &cl, &err), &err);
        const char *b_at = canon ? strstr(canon, "id=1:b\n") : NULL;
        const char *c_at = canon ? strstr(canon, "id=1:c\n") : NULL;
        CHECK(b_at && c_at && b_at < c_at);
        if (b_at && c_at) {
            const char *sha = strstr(b_at, "image_sha256");
            CHECK(sha == NULL || sha > c_at);
        }
        free(canon);
    }
    kvs_dataset_free(d);
    d = NULL;
    /* the changed image changes the dataset hash (and with it every cell key) */
    CHECK_OK(kvs_dataset_load_milebench(task, kvs_sha256_hex, &d, &err), &err);
    if (d) CHECK_MSG(strcmp(d->hash, hash1) != 0, "the hash %s ignores an image's bytes", d->hash);
    kvs_dataset_free(d);
    d = NULL;
    put(p, IMG[2], sizeof IMG[2]); /* back */
    CHECK_OK(kvs_dataset_load_milebench(task, kvs_sha256_hex, &d, &err), &err);
    if (d) CHECK(!strcmp(d->hash, hash1));
    kvs_dataset_free(d);
    d = NULL;

    /* without images/: relative to the task's folder; the same task and bytes
     * hash the same wherever they were found */
    snprintf(flat, sizeof flat, "%s/flat", dir);
    mkdir(flat, 0700);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/p%d.png", flat, i + 1);
        put(p, IMG[i], sizeof IMG[i]);
    }
    snprintf(p, sizeof p, "%s/T.json", flat);
    puts_file(p, TASK);
    CHECK_OK(kvs_dataset_load_milebench(p, kvs_sha256_hex, &d, &err), &err);
    if (d) {
        char want[512];
        snprintf(want, sizeof want, "%s/p2.png", flat);
        CHECK_MSG(!strcmp(d->samples[0].image_files[1], want), "%s", d->samples[0].image_files[1]);
        CHECK(!strcmp(d->hash, hash1));
    }
    kvs_dataset_free(d);
    d = NULL;
    unlink(p);
    /* an absolute path is used as is */
    char abs_task[1024];
    snprintf(abs_task, sizeof abs_task,
             "{\"meta_data\": {}, \"data\": [{\"sample_id\": 9, \"task_instance\": {\"context\": \"{image#1}?\","
             " \"images_path\": [\"%s/p1.png\"]}, \"response\": \"r\"}]}",
             flat);
    snprintf(p, sizeof p, "%s/abs.json", dir);
    puts_file(p, abs_task);
    CHECK_OK(kvs_dataset_load_milebench(p, kvs_sha256_hex, &d, &err), &err);
    if (d) {
        char want[512];
        snprintf(want, sizeof want, "%s/p1.png", flat);
        CHECK(!strcmp(d->samples[0].image_files[0], want));
        CHECK(!strcmp(d->samples[0].context, M "?"));
    }
    kvs_dataset_free(d);
    d = NULL;
    unlink(p);

    /* ---- errors: each names the task file, the sample and k or the path ---- */
    fails(dir, "range.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s7\", \"task_instance\": {\"context\": \"{image#1} {image#4}\","
          " \"images_path\": [\"p1.png\", \"p2.png\", \"p3.png\"]}, \"response\": \"r\"}]}",
          KVS_ERR_FORMAT, "sample 's7'", "{image#4}", "image 4");
    fails(dir, "zero.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s0\", \"task_instance\": {\"context\": \"{image#0}\","
          " \"images_path\": [\"p1.png\"]}, \"response\": \"r\"}]}",
          KVS_ERR_FORMAT, "sample 's0'", "image 0", NULL);
    fails(dir, "none.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s1\", \"task_instance\": {\"context\": \"{table#1}\"},"
          " \"response\": \"r\"}]}",
          KVS_ERR_FORMAT, "sample 's1'", "image 1", "0 entries");
    snprintf(p, sizeof p, "%s/gone.png", imgdir);
    fails(dir, "missing.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s2\", \"task_instance\": {\"context\": \"{image#1}\","
          " \"images_path\": [\"gone.png\"]}, \"response\": \"r\"}]}",
          KVS_ERR_IO, "sample 's2'", p, "cannot be opened");
    /* over the cap: a sparse file of 64 MiB + 1 byte (no disk used) */
    snprintf(p, sizeof p, "%s/huge.png", imgdir);
    FILE *f = fopen(p, "wb");
    CHECK(f && ftruncate(fileno(f), (off_t)KVS_DS_IMAGE_MAX_BYTES + 1) == 0);
    if (f) fclose(f);
    fails(dir, "huge.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s3\", \"task_instance\": {\"context\": \"{image#1}\","
          " \"images_path\": [\"huge.png\"]}, \"response\": \"r\"}]}",
          KVS_ERR_INVALID, "sample 's3'", p, "64 MiB");
    unlink(p);
    fails(dir, "dirimg.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s4\", \"task_instance\": {\"context\": \"x\","
          " \"images_path\": [\".\"]}, \"response\": \"r\"}]}",
          KVS_ERR_IO, "sample 's4'", "not a regular file", NULL);
    fails(dir, "marker.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s5\", \"task_instance\": {\"context\": \"a " M " b\","
          " \"images_path\": [\"p1.png\"]}, \"response\": \"r\"}]}",
          KVS_ERR_FORMAT, "sample 's5'", "task_instance.context", M);
    fails(dir, "choice.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": \"s6\", \"task_instance\": {\"context\": \"{image#1}\","
          " \"images_path\": [\"p1.png\", \"p2.png\"], \"choice_list\": [\"x\", \"{image#2}\"]}, \"response\": \"r\"}]}",
          KVS_ERR_UNSUPPORTED, "sample 's6'", "choice_list[1]", "{image#2}");

    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/p%d.png", imgdir, i + 1);
        unlink(p);
        snprintf(p, sizeof p, "%s/p%d.png", flat, i + 1);
        unlink(p);
    }
    unlink(task);
    rmdir(imgdir);
    rmdir(flat);
    rmdir(dir);
    return kvs_test_finish("test_ds_milebench_images");
}
