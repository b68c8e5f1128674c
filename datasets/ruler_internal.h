/*
 * ruler_internal.h -- private to the RULER generator of kvsieve_datasets
 * (ruler.c, ruler_tasks.c, ruler_data.c, ruler_words.c): the word lists, the
 * data files read at run time (essays, SQuAD, HotpotQA), the sentence
 * splitter, and the state shared by the fitting loop and the task builders.
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

/* ---- the generator's working state (ruler.c, ruler_tasks.c) ---------------------- */

/* A sample under construction: the prompt split at the end of the context,
 * owned answers and the answers' spans (offsets into ctx). */
typedef struct {
    kvs_ds_buf ctx;   /* the part up to and including the context */
    kvs_ds_buf q;     /* question and answer prefix */
    ruler_strv ans;   /* owned answers */
    kvs_span *spans;  /* [n_spans] offsets into ctx */
    int n_spans, cap_spans;
} built;

void ruler_built_reset(built *b);
void ruler_built_free(built *b);
kvs_status ruler_add_span(built *b, int64_t s, int64_t e, kvs_err *err);
kvs_status ruler_add_answer(built *b, const char *a, kvs_err *err);

/* The generator of one (task, length, sample). */
typedef struct gen gen;
/* Build the sample's prompt with haystack size h (sentences, words, lines,
 * noise lines, list words, coded words or documents, by task). The same g
 * and h always give the same prompt. */
typedef kvs_status (*build_fn)(gen *g, int64_t h, built *b, kvs_err *err);
struct gen {
    const kvs_ruler_opts *o;
    const kvs_ruler_task *t;
    ruler_data *data;
    int64_t length;
    int index;          /* sample index within (task, length) */
    uint64_t sample_seed;
    ruler_strv pool;    /* word lists (borrowed from adjs/nouns/verbs) */
    ruler_strv adjs, nouns, verbs;
    const ruler_qa_set *qa;
    char *icl;          /* vt: the worked example of this (task, length) */
    int *scratch;       /* sized for the largest sampling */
    size_t scratch_n;
    kvs_ds_buf tmp;
};

kvs_status ruler_build_niah(gen *g, int64_t h, built *b, kvs_err *err);
kvs_status ruler_build_vt(gen *g, int64_t h, built *b, kvs_err *err);
kvs_status ruler_build_vt_icl(gen *g, int64_t h, built *b, kvs_err *err); /* the worked example */
kvs_status ruler_build_cwe(gen *g, int64_t h, built *b, kvs_err *err);
kvs_status ruler_build_fwe(gen *g, int64_t h, built *b, kvs_err *err);
kvs_status ruler_build_qa(gen *g, int64_t h, built *b, kvs_err *err);

#endif
