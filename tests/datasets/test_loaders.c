/*
 * test_loaders.c -- the JSONL QA, LongBench and MileBench loaders on small
 * files written here: fields, ids, content hashes (stable over formatting,
 * changed by content), image flagging (images: test_milebench_images.c) and the text-only refusal, and
 * malformed inputs whose errors must name file:line (or data[i]) and field.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvs_datasets.h"
#include "kvs_eval.h"
#include "test_util.h"

static char dir[64];

static const char *write_file(const char *name, const char *text) {
    static char path[4][256];
    static int k = 0;
    char *p = path[k++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return p;
}

static void fails(kvs_status (*load)(const char *, kvs_ds_hash_fn, kvs_dataset **, kvs_err *),
                  const char *name, const char *text, kvs_status code, const char *w1,
                  const char *w2) {
    kvs_err err = {0};
    kvs_dataset *d = NULL;
    const char *p = write_file(name, text);
    kvs_status st = load(p, kvs_sha256_hex, &d, &err);
    CHECK_MSG(st == code && strstr(err.msg, w1) && (!w2 || strstr(err.msg, w2)) && !d,
              "%s: got %d \"%s\", want %d with \"%s\" and \"%s\"", name, (int)st, err.msg, (int)code,
              w1, w2 ? w2 : "");
    kvs_dataset_free(d);
}

int main(void) {
    kvs_err err = {0};
    snprintf(dir, sizeof dir, "/tmp/kvs_ds_test_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }

    /* ---- JSONL QA ---- */
    const char *qa =
        "{\"id\": \"q1\", \"context\": \"Mount Fuji is in Japan.\", \"question\": \"Where is Mount Fuji?\", \"answers\": [\"Japan\", \"in Japan\"]}\n"
        "\n"
        "{\"id\": 7, \"context\": \"\", \"question\": \"Pick one\", \"answers\": \"B\", \"choices\": [\"red\", \"blue\"]}\r\n"
        "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"], \"extra\": 1}\n";
    kvs_dataset *d = NULL, *d2 = NULL;
    CHECK_OK(kvs_dataset_load_jsonl(write_file("qa.jsonl", qa), kvs_sha256_hex, &d, &err), &err);
    if (d) {
        CHECK_EQ_INT(d->n_samples, 3);
        CHECK(!strcmp(d->name, "qa") && !strcmp(d->kind, "jsonl"));
        CHECK(!strcmp(d->version, KVS_DS_JSONL_VERSION));
        CHECK_EQ_INT(strlen(d->hash), 64);
        CHECK(!strcmp(d->samples[0].id, "q1"));
        CHECK_EQ_INT(d->samples[0].n_answers, 2);
        CHECK(!strcmp(d->samples[0].answers[1], "in Japan"));
        CHECK(!strcmp(d->samples[0].question, "Where is Mount Fuji?"));
        CHECK(!strcmp(d->samples[1].id, "7"));
        CHECK_EQ_INT(d->samples[1].n_answers, 1);
        CHECK_EQ_INT(d->samples[1].n_choices, 2);
        CHECK(!strcmp(d->samples[1].choices[1], "blue"));
        CHECK(!strcmp(d->samples[2].id, "4")); /* no id: the line number */
        CHECK(d->samples[2].choices == NULL && d->samples[2].n_choices == 0);
        CHECK(!kvs_sample_has_images(&d->samples[0]));
        CHECK_OK(kvs_sample_require_text(d, &d->samples[0], &err), &err);
        /* the hash is over content: reformatting keeps it, a changed answer changes it */
        const char *qa_fmt =
            "{ \"question\": \"Where is Mount Fuji?\",  \"id\":\"q1\", \"answers\": [\"Japan\",\"in Japan\"], \"context\": \"Mount Fuji is in Japan.\" }\n"
            "{\"id\": \"7\", \"context\": \"\", \"question\": \"Pick one\", \"answers\": [\"B\"], \"choices\": [\"red\", \"blue\"]}\n"
            "\n\n{\"id\": 4, \"context\": \"c\", \"question\": \"q\", \"answers\": \"a\"}";
        CHECK_OK(kvs_dataset_load_jsonl(write_file("qa2.jsonl", qa_fmt), kvs_sha256_hex, &d2, &err), &err);
        if (d2) CHECK_MSG(!strcmp(d->hash, d2->hash), "%s vs %s", d->hash, d2->hash);
        kvs_dataset_free(d2);
        d2 = NULL;
        char *changed = strdup(qa);
        *strstr(changed, "in Japan") = 'I';
        CHECK_OK(kvs_dataset_load_jsonl(write_file("qa3.jsonl", changed), kvs_sha256_hex, &d2, &err), &err);
        if (d2) CHECK(strcmp(d->hash, d2->hash) != 0);
        free(changed);
        kvs_dataset_free(d2);
        d2 = NULL;
        /* the canonical text is what is hashed */
        char *canon = NULL, hex[65];
        size_t n = 0;
        CHECK_OK(kvs_dataset_canonical(d, &canon, &n, &err), &err);
        if (canon) {
            kvs_sha256_hex(canon, n, hex);
            CHECK(!strcmp(hex, d->hash));
            CHECK(strstr(canon, "question=20:Where is Mount Fuji?\n") != NULL);
        }
        free(canon);
    }
    kvs_dataset_free(d);
    d = NULL;

    /* malformed JSONL: errors name file:line and field */
    fails(kvs_dataset_load_jsonl, "bad1.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"]}\n\n{\"context\": \"c\", \"question\": \n",
          KVS_ERR_FORMAT, "bad1.jsonl:3:", "not valid JSON");
    fails(kvs_dataset_load_jsonl, "bad2.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"]}\n{\"context\": \"c\", \"answers\": [\"a\"]}\n",
          KVS_ERR_FORMAT, "bad2.jsonl:2: question", "missing");
    fails(kvs_dataset_load_jsonl, "bad3.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\", 3]}\n", KVS_ERR_FORMAT,
          "bad3.jsonl:1: answers", "element 1 is not a string");
    fails(kvs_dataset_load_jsonl, "bad4.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"], \"choices\": \"x\"}\n",
          KVS_ERR_FORMAT, "bad4.jsonl:1: choices", "expected an array of strings");
    fails(kvs_dataset_load_jsonl, "bad5.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": []}\n", KVS_ERR_FORMAT,
          "bad5.jsonl:1: answers", "empty");
    fails(kvs_dataset_load_jsonl, "bad6.jsonl", "[1, 2]\n", KVS_ERR_FORMAT, "bad6.jsonl:1:",
          "expected a JSON object");
    fails(kvs_dataset_load_jsonl, "bad9.jsonl",
          "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"]}\n{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"]} {\"x\": 1}\n",
          KVS_ERR_FORMAT, "bad9.jsonl:2:", "unexpected text after the JSON object");
    fails(kvs_dataset_load_milebench, "mbbad6.json", "{\"meta_data\": {}, \"data\": [1]}\n\n}",
          KVS_ERR_FORMAT, "mbbad6.json:3:", "unexpected text");
    fails(kvs_dataset_load_jsonl, "bad7.jsonl", "\n  \n", KVS_ERR_FORMAT, "bad7.jsonl", "no samples");
    fails(kvs_dataset_load_jsonl, "bad8.jsonl",
          "{\"context\": 5, \"question\": \"q\", \"answers\": [\"a\"]}\n", KVS_ERR_FORMAT,
          "bad8.jsonl:1: context", "expected a string");
    CHECK_FAILS(kvs_dataset_load_jsonl("/nonexistent/x.jsonl", kvs_sha256_hex, &d, &err),
                KVS_ERR_IO, &err, "/nonexistent/x.jsonl");

    /* ---- LongBench ---- */
    const char *lb =
        "{\"input\": \"Who wrote it?\", \"context\": \"A long report by Ada.\", \"answers\": [\"Ada\"], "
        "\"length\": 5, \"dataset\": \"qasper\", \"language\": \"en\", \"all_classes\": null, \"_id\": \"abc123\"}\n";
    CHECK_OK(kvs_dataset_load_longbench(write_file("qasper.jsonl", lb), kvs_sha256_hex, &d, &err), &err);
    if (d) {
        CHECK_EQ_INT(d->n_samples, 1);
        CHECK(!strcmp(d->samples[0].id, "abc123"));
        CHECK(!strcmp(d->samples[0].question, "Who wrote it?"));
        CHECK(!strcmp(d->samples[0].context, "A long report by Ada."));
        CHECK(!strcmp(d->version, KVS_DS_LONGBENCH_VERSION) && !strcmp(d->kind, "longbench"));
    }
    kvs_dataset_free(d);
    d = NULL;
    fails(kvs_dataset_load_longbench, "lbbad.jsonl",
          "{\"context\": \"c\", \"answers\": [\"a\"], \"_id\": \"x\"}\n", KVS_ERR_FORMAT,
          "lbbad.jsonl:1: input", "missing");

    /* ---- MileBench ---- */
    const char *mb =
        "{\"meta_data\": {\"task\": \"Spot the change\", \"question_type\": \"multi-choice\",\n"
        "  \"task_instruction\": [\"Look at the images. \", \"Compare the two frames. \"]},\n"
        " \"data\": [\n"
        "  {\"sample_id\": 0, \"task_instruction_id\": 1,\n"
        "   \"task_instance\": {\"context\": \"First {image#1} then {image#2}. What moved?\",\n"
        "                     \"images_path\": [\"a.jpg\", \"b.jpg\"], \"choice_list\": [\"the cup\", \"the cat\"]},\n"
        "   \"response\": \"the cat\"},\n"
        "  {\"sample_id\": \"s1\", \"task_instance\": {\"context\": \"No pictures here.\", \"images_path\": []},\n"
        "   \"response\": [\"yes\", \"y\"]}\n"
        " ]}\n";
    /* the images beside the task (no images/ folder): read and hashed at load */
    write_file("a.jpg", "not really a jpeg");
    write_file("b.jpg", "nor this");
    CHECK_OK(kvs_dataset_load_milebench(write_file("Change.json", mb), kvs_sha256_hex, &d, &err), &err);
    if (d) {
        CHECK_EQ_INT(d->n_samples, 2);
        CHECK(!strcmp(d->metric, "choice") && !strcmp(d->kind, "milebench"));
        const kvs_sample *s = &d->samples[0];
        CHECK(!strcmp(s->id, "0"));
        CHECK(kvs_sample_has_images(s));
        CHECK_EQ_INT(s->n_images, 2);
        CHECK(!strcmp(s->images[1], "b.jpg"));
        CHECK(!strcmp(s->context, "First " KVS_MEDIA_MARKER " then " KVS_MEDIA_MARKER ". What moved?"));
        CHECK(s->n_media == 2 && s->media[0] == 0 && s->media[1] == 1);
        CHECK(!strcmp(s->question, "Compare the two frames. "));
        CHECK_EQ_INT(s->n_choices, 2);
        CHECK(!strcmp(s->answers[0], "the cat"));
        CHECK_FAILS(kvs_sample_require_text(d, s, &err), KVS_ERR_UNSUPPORTED, &err, "sample '0' has 2 images");
        CHECK(strstr(err.msg, "text-only") && strstr(err.msg, "multimodal") && strstr(err.msg, "Change"));
        s = &d->samples[1];
        CHECK(!kvs_sample_has_images(s));
        CHECK(!strcmp(s->question, "Look at the images. ")); /* task_instruction_id defaults to 0 */
        CHECK_EQ_INT(s->n_answers, 2);
        CHECK_OK(kvs_sample_require_text(d, s, &err), &err);
    }
    kvs_dataset_free(d);
    d = NULL;
    fails(kvs_dataset_load_milebench, "mbbad1.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": 0, \"task_instance\": {\"context\": \"x\"}, \"response\": \"a\"},"
          " {\"sample_id\": 1, \"task_instance\": {\"images_path\": []}, \"response\": \"a\"}]}",
          KVS_ERR_FORMAT, "mbbad1.json: data[1].task_instance.context", "missing");
    fails(kvs_dataset_load_milebench, "mbbad2.json",
          "{\"meta_data\": {\"task_instruction\": [\"i\"]}, \"data\": [{\"sample_id\": 0, \"task_instruction_id\": 5,"
          " \"task_instance\": {\"context\": \"x\"}, \"response\": \"a\"}]}",
          KVS_ERR_FORMAT, "data[0].task_instruction_id", "1 entries");
    fails(kvs_dataset_load_milebench, "mbbad3.json", "{\"data\": []}", KVS_ERR_FORMAT,
          "mbbad3.json: meta_data", "missing");
    fails(kvs_dataset_load_milebench, "mbbad4.json", "{\"meta_data\": {},\n \"data\": [\n {]}",
          KVS_ERR_FORMAT, "mbbad4.json:3:", "not valid JSON");
    fails(kvs_dataset_load_milebench, "mbbad5.json",
          "{\"meta_data\": {}, \"data\": [{\"sample_id\": 0, \"task_instance\": {\"context\": \"x\", \"images_path\": \"a.jpg\"}, \"response\": \"a\"}]}",
          KVS_ERR_FORMAT, "data[0].task_instance.images_path", "array of strings");

    /* ---- dispatch ---- */
    CHECK_OK(kvs_dataset_load("jsonl", write_file("qa.jsonl", qa), kvs_sha256_hex, &d, &err), &err);
    kvs_dataset_free(d);
    d = NULL;
    CHECK_FAILS(kvs_dataset_load("jsnl", "x", kvs_sha256_hex, &d, &err), KVS_ERR_NOTFOUND, &err,
                "did you mean 'jsonl'");
    CHECK_FAILS(kvs_dataset_load_jsonl(write_file("qa.jsonl", qa), NULL, &d, &err), KVS_ERR_INVALID,
                &err, "hash");

    const char *names[] = {"qa", "qa2", "qa3", "bad1", "bad2", "bad3", "bad4", "bad5", "bad6", "bad7",
                           "bad8", "bad9", "lbbad", "qasper"};
    char p[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s.jsonl", dir, names[i]);
        unlink(p);
    }
    const char *jn[] = {"Change", "mbbad1", "mbbad2", "mbbad3", "mbbad4", "mbbad5", "mbbad6"};
    for (size_t i = 0; i < sizeof jn / sizeof jn[0]; i++) {
        snprintf(p, sizeof p, "%s/%s.json", dir, jn[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/a.jpg", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/b.jpg", dir);
    unlink(p);
    rmdir(dir);
    return kvs_test_finish("test_ds_loaders");
}
