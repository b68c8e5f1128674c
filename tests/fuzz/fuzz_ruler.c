/*
 * fuzz_ruler.c -- fuzz target for the readers of RULER's data files
 * (datasets/ruler_data.c): the first byte picks the file
 * (PaulGrahamEssays.json, squad.json, hotpotqa.json), the rest is its
 * content. Essays that load are split into words and, rejoined with single
 * spaces, into sentences (ruler_sentences); kvs_ruler_essays reads the same
 * file. Errors are expected; a crash or a sanitizer report is a bug.
 */
#include "fuzz_util.h"
#include "ruler_internal.h"

static void essays(ruler_data *d) {
    kvs_err err = {0};
    if (ruler_data_essay(d, &err) != KVS_OK) return;
    size_t n = 0;
    for (int i = 0; i < d->words.n; i++) n += strlen(d->words.v[i]) + 1;
    char *text = malloc(n + 1), *w = text;
    if (!text) abort();
    for (int i = 0; i < d->words.n; i++) {
        size_t k = strlen(d->words.v[i]);
        if (i) *w++ = ' ';
        memcpy(w, d->words.v[i], k);
        w += k;
    }
    *w = '\0';
    size_t *starts = NULL;
    int ns = 0;
    if (ruler_sentences(text, (size_t)(w - text), &starts, &ns, &err) == KVS_OK) {
        for (int i = 0; i < ns; i++)
            if (starts[i] > (size_t)(w - text)) abort();
        free(starts);
    }
    free(text);
    char *raw = NULL;
    size_t len = 0;
    if (kvs_ruler_essays(d->dir, &raw, &len, &err) == KVS_OK) free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const files[3] = {"PaulGrahamEssays.json", "squad.json", "hotpotqa.json"};
    if (size < 1) return 0;
    int k = data[0] % 3;
    char path[128];
    fuzz_write(files[k], data + 1, size - 1, path, sizeof path);
    ruler_data d;
    memset(&d, 0, sizeof d);
    snprintf(d.dir, sizeof d.dir, "%s", fuzz_tmpdir());
    d.hash = fuzz_hash;
    if (k == 0) {
        essays(&d);
    } else {
        const ruler_qa_set *q = NULL;
        kvs_err err = {0};
        if (ruler_data_qa(&d, k == 1 ? "squad" : "hotpot", &q, &err) == KVS_OK) {
            for (int i = 0; i < q->n_qas; i++) {
                const ruler_qa *r = &q->qas[i];
                for (int j = 0; j < r->n_context; j++)
                    if (r->context[j] < 0 || r->context[j] >= q->docs.n) abort();
                for (int j = 0; j < r->n_more; j++)
                    if (r->more[j] < 0 || r->more[j] >= q->docs.n) abort();
            }
        }
    }
    ruler_data_free(&d);
    remove(path);
    return 0;
}
