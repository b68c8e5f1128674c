/*
 * ruler_internal.h -- private to the RULER generator of kvsieve_datasets
 * (ruler.c, ruler_data.c, ruler_words.c): the word lists, the data files
 * read at run time (essays, SQuAD, HotpotQA) and the sentence splitter.
 * Not installed, not part of the public API.
 */
#ifndef KVS_RULER_INTERNAL_H
#define KVS_RULER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ds_internal.h"

/* Space-separated word lists (ruler_words.c). */
extern const char kvs_ruler_adjectives[];
extern const char kvs_ruler_nouns[];
extern const char kvs_ruler_verbs[];

/* A growable list of strings (owned or borrowed: the caller says when freeing). */
typedef struct {
    char **v;
    int n, cap;
} ruler_strv;

kvs_status ruler_strv_push(ruler_strv *s, char *p, kvs_err *err);
void ruler_strv_free(ruler_strv *s, int free_items);
/* Split a space-separated list into owned words. */
kvs_status ruler_split_words(const char *list, ruler_strv *out, kvs_err *err);

typedef struct {
    char *query;
    char **outputs; /* [n_outputs] reference answers */
    int n_outputs;
    int *context; /* [n_context] gold document indices */
    int n_context;
    int *more; /* [n_more] other documents of the same article (SQuAD) */
    int n_more;
} ruler_qa;

typedef struct {
    ruler_strv docs; /* unique documents, sorted (bytewise) */
    ruler_qa *qas;   /* [n_qas] in file order */
    int n_qas;
} ruler_qa_set;

/* The data files of one generate call, read on first need. */
typedef struct {
    char dir[1024];
    int have_essay, have_squad, have_hotpot;
    char *essay_text;  /* the essays' "text" */
    ruler_strv words;  /* its whitespace-separated words (pointers into essay_words_buf) */
    char *essay_words_buf;
    ruler_qa_set squad, hotpot;
    kvs_ds_buf hashes; /* "file=sha256\n" of each file read, in reading order */
    kvs_ds_hash_fn hash;
} ruler_data;

void ruler_data_free(ruler_data *d);
kvs_status ruler_data_essay(ruler_data *d, kvs_err *err);
kvs_status ruler_data_qa(ruler_data *d, const char *which, const ruler_qa_set **out, kvs_err *err);

/* Sentences of text[0..n) (which has single spaces between words): the
 * start offset of each, [*n_out]; a sentence ends after '.', '!' or '?'
 * (and closing quotes or brackets) followed by a space and a character that
 * is not a lower-case letter, unless the word is a common abbreviation or a
 * single letter (an initial). Sentences are separated by exactly one space,
 * so joining them with " " gives the text back. Caller frees *starts. */
kvs_status ruler_sentences(const char *text, size_t n, size_t **starts, int *n_out, kvs_err *err);

#endif
