/*
 * kvs_eval.h -- the experiment runner: Lua configs, the grid, the SQLite
 * results store, and reports over it.
 *
 * What it is: everything between "a Lua file describes an experiment" and
 * "a table in a paper": config loading (a sandboxed Lua 5.4 state per file),
 * grid expansion with exact cell keys (SHA-256 of the canonical cell
 * definition) and their shard partition, the runner for the offline
 * `fidelity` kind, the store (schema, migrations, provenance, the exact
 * union of stores: merge) and reports (md / LaTeX / CSV / JSON, gnuplot
 * plots, the decode-speed study) computed by SQL over the store.
 * What it is not: no compression logic (methods/), no file formats
 * (formats/), no model. Kind `task` (prompts from datasets/ sent over HTTP
 * to a backend, scored by metrics.c) is run by task.c with client.c and
 * embedded.c (kvs_client.h, kvs_task.h). Kind `overhead` (the latency
 * study) is run by overhead.c.
 */
#ifndef KVS_EVAL_H
#define KVS_EVAL_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "kvs_datasets.h"
#include "kvsieve.h"
#include "kvsieve_methods.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------ */

typedef struct {
    uint32_t h[8];
    uint64_t len;    /* bytes hashed so far */
    uint8_t buf[64]; /* pending partial block */
    size_t nbuf;
} kvs_sha256_ctx;

void kvs_sha256_init(kvs_sha256_ctx *c);
void kvs_sha256_update(kvs_sha256_ctx *c, const void *data, size_t n);
void kvs_sha256_final(kvs_sha256_ctx *c, uint8_t out[32]);
/* One-shot digest as 64 lowercase hex characters + NUL. */
void kvs_sha256_hex(const void *data, size_t n, char out[65]);
/* Digest of a whole file (read in 1 MiB pieces) as 64 hex characters + NUL;
 * errors name the path. Defined in task.c (it hashes the backend's model). */
kvs_status kvs_sha256_file(const char *path, char out[65], kvs_err *err);

/* ---- Experiments (what a config describes) -------------------------------- */

typedef enum { KVS_KIND_FIDELITY = 0, KVS_KIND_OVERHEAD = 1, KVS_KIND_TASK = 2 } kvs_exp_kind;
const char *kvs_exp_kind_name(kvs_exp_kind k);

/* A model shape: a synthetic preset name or a custom one. */
typedef struct {
    char name[48]; /* preset ("gemma3-270m") or "custom-L2-Hq4-Hkv2-d16" */
    int n_layers, n_q_heads, n_kv_heads, head_dim;
} kvs_eval_shape;

/* One method with one parameter assignment (a point of the params sweep). */
typedef struct {
    const kvs_method *method;
    kvs_params params;
    char label[160];  /* "flashcache gamma=0.1" (only explicitly set params) */
    char params_json[512]; /* every parameter, canonical: {"gamma":"0.1",...} */
} kvs_variant;

typedef struct {
    char name[64];
    kvs_exp_kind kind;
    int line; /* line of the experiment{...} call */

    /* dataset: "synthetic" (fidelity, overhead); task: "niah" or "ruler"
     * (generated) or a file dataset "jsonl", "longbench", "milebench"
     * (dataset_path) */
    char dataset[16];
    int n_shapes;
    kvs_eval_shape *shapes; /* [n_shapes] */
    int n_lengths;
    int *lengths; /* [n_lengths] N (synthetic) or prompt lengths (niah) */
    int n_seeds;
    int64_t *seeds; /* [n_seeds] */
    int queries;    /* synthetic: recorded queries per layer, -1 = all N */
    int probes, outliers, sinks; /* synthetic; 0 outliers = generator default */
    double image_frac;
    int n_depths;
    double *depths; /* niah: [n_depths] in [0, 1] */
    int per_cell;   /* niah */

    int n_variants;
    kvs_variant *variants; /* methods x params sweep, registry order kept */
    /* methods composed from parts in `methods` (tables), owned here
     * (eval/config_method.c) */
    int n_composed;
    struct kvs_composed **composed;
    int n_budgets;
    kvs_budget *budgets;

    /* task / overhead */
    int backend_embedded;
    char backend_url[256];
    char model[256];
    int n_metrics;
    char (*metrics)[32];
    int repeats, warmup; /* overhead */
    char device[8];      /* overhead: "cpu" or "cuda" (the first of devices) */
    kvs_dtype dtype;     /* overhead: cache dtype (the first of dtypes) */
    /* overhead: the extra grid axes (each given as a value or a list) and
     * per-method token limits (max_tokens = { h2o = 8192, snapkv = {
     * ["qwen2.5-vl-7b"] = 4096 } }): cells with N above a limit are not in
     * the grid; a limit of 0 means the method does not run (at that shape); a
     * limit for a shape wins over one for every shape. */
    int n_dtypes;
    kvs_dtype dtypes[3];
    int n_devices;
    char devices[2][8];
    int n_thread_counts;
    int thread_counts[16];
    int n_limits;
    struct {
        char method[32];
        char shape[48]; /* "" = every shape */
        int max_tokens;
    } limits[192]; /* every preset x three shapes, with room */

    /* task (eval/task.c): file datasets jsonl{...} / longbench{...} /
     * milebench{...}, prompt template and modes, generation length, and the
     * backend beyond backend_url (the first of backend_urls) */
    char dataset_path[1024]; /* file datasets: realpath of `path` */
    int limit;               /* file datasets: the first `limit` samples (0: all) */
    char prompt_template[32]; /* "" = the dataset's default */
    int n_modes;
    int modes[2];  /* kvs_prompt_mode values (datasets/kvs_datasets.h), in config order */
    int n_predict; /* tokens generated per variant */
    int ignore_eos; /* 1: decode exactly n_predict tokens: end-of-generation tokens and the
                     * newline stop do not end an answer (llama-server's ignore_eos, sent in
                     * every request; part of the cell key: it changes the decoded length) */
    int variants_per_request; /* at most this many variants share one request (1..160;
                               * 0: 160 for the embedded backend, started with --batch 160
                               * (a sample's two settings of a leaderboard grid),
                               * 64 for a URL, the server's default batch); 1 decodes every
                               * variant alone, as a decode-speed study needs (a batched
                               * decode times all variants together). Not in the key:
                               * outputs do not depend on it */
    int n_backend_urls;
    char (*backend_urls)[256]; /* [n_backend_urls] */
    int backend_openai;        /* backend.api = "openai": plain OpenAI server, `full` only */
    int backend_threads, backend_ctx; /* embedded: serve --threads / --ctx (0: its default) */
    char backend_cache_k[8], backend_cache_v[8]; /* embedded: serve -ctk / -ctv, backend.cache
                                                    ("": not given, the server's f16) */
    int in_flight;             /* requests in flight per backend URL */
    /* ruler{ tasks, lengths, n, seed, data, setting }: the tasks with their
     * arguments (lengths, seeds[0] and per_cell = n hold the rest);
     * dataset_data: the RULER data folder ("" = kvs_ruler_find_data's
     * lookup). niah{ haystack }: "" (kvsieve's own prose) or "paul_graham"
     * (the essays of the RULER data). A dataset's `setting` (one or both of
     * query_aware, query_agnostic) fills modes when the experiment gives no
     * mode/setting of its own. n_predict 0 (ruler's default): each sample's
     * own tokens to generate. */
    int n_ruler_tasks;
    kvs_ruler_task *ruler_tasks; /* [n_ruler_tasks] */
    char dataset_data[1024];
    char haystack[16];
    int n_ds_modes;
    int ds_modes[2];
    /* kv_spans = false: do not send the answers' byte ranges (no
     * answer_kept scores); default true for samples that have them */
    int no_kv_spans;

    int threads;
} kvs_experiment;

typedef struct {
    char path[1024];
    char dir[1024]; /* realpath of the config's folder (the io.open sandbox) */
    char *text;     /* the config text, as read */
    char hash[65];  /* SHA-256 of text + overrides */
    char *overrides; /* "-D a=b -D c=d" as given, or NULL */
    int n_experiments;
    kvs_experiment *experiments;
} kvs_config;

/* Load and validate a config. overrides are "key=value" strings applied to
 * every experiment{...} table before validation ("budgets={0.1,0.2}",
 * "dataset.n_tokens=512", "name=x"); the value is read as a Lua expression,
 * or as a string if it is not one. Every error names file:line and the field
 * ("fidelity.lua:7: budgets[2]: 1.5 out of range: ..."). */
kvs_status kvs_config_load(const char *path, const char *const *overrides, int n_overrides,
                           kvs_config *cfg, kvs_err *err);
/* The same, the overrides applied only to the experiment{} tables named
 * only (NULL: every one), so that `kvsieve run --experiment NAME -D ...`
 * may set a field the file's other experiments do not have. */
kvs_status kvs_config_load_only(const char *path, const char *only, const char *const *overrides, int n_overrides,
                                kvs_config *cfg, kvs_err *err);
/* The same from text (path is only used in messages and as the sandbox
 * root's folder). */
kvs_status kvs_config_load_text(const char *path, const char *text,
                                const char *const *overrides, int n_overrides, kvs_config *cfg,
                                kvs_err *err);
void kvs_config_free(kvs_config *cfg);

/* ---- The grid ------------------------------------------------------------- */

typedef struct {
    char key[65]; /* SHA-256 of def */
    int shape, length, seed, variant, budget; /* indices into the experiment */
    int dtype, device, threads; /* overhead: indices into dtypes, devices, thread_counts */
    char def[1024]; /* canonical definition text (hashed) */
} kvs_cell;

/* Expand an experiment into cells, ordered shape, length, seed (outer),
 * variant, budget (inner); `full` gets one cell per dataset instance (it
 * keeps everything, the budget does not change it). Kind overhead: shape,
 * length, dtype, device, threads, variant, budget; its seeds are the
 * rotated input sets of every cell, not an axis; cells above a max_tokens
 * limit are left out. Kind task: only the niah grid's size and shape
 * (lengths x depths x per_cell); the runner expands task cells itself with
 * the loaded dataset, model hash and template hash (task.c), so these keys
 * are not the stored ones. Caller frees *cells. */
kvs_status kvs_grid_expand(const kvs_experiment *e, kvs_cell **cells, int *n_cells, kvs_err *err);

/* The shard (0 .. n_shards-1) of a partition key: the first 64 bits of
 * SHA-256(partition_key), big-endian, mod n_shards (0 when n_shards <= 1).
 * The partition key of a fidelity or overhead cell is its cell key; of a
 * task cell, its request unit "task-unit\n<experiment>\n<mode>\n<sample id>"
 * (every variant of one sample and mode in one shard: one prefill serves
 * them all). So the partition depends only on what defines a cell: not on
 * grid order, on which cells are done, or on the machine. */
int kvs_shard_of(const char *partition_key, int n_shards);

/* ---- The store ------------------------------------------------------------ */

#define KVS_STORE_SCHEMA_VERSION 5
#define KVS_STORE_DEFAULT_PATH "results/kvsieve.db"

typedef struct kvs_store kvs_store;

/* Open or create (with parent folder) and migrate to the current schema.
 * WAL, busy_timeout 30 s, foreign keys on. */
kvs_status kvs_store_open(const char *path, kvs_store **out, kvs_err *err);
void kvs_store_close(kvs_store *s);
int kvs_store_schema_version(kvs_store *s);
struct sqlite3 *kvs_store_db(kvs_store *s);
const char *kvs_store_path(const kvs_store *s); /* as given to kvs_store_open */

typedef struct {
    const char *experiment, *kind;
    const char *config_path, *config_text, *config_hash, *overrides;
    const char *config_dir; /* where `git rev-parse HEAD` is asked */
    int64_t n_cells;
} kvs_run_info;

/* Insert a run row with provenance (git revision when there is one, host,
 * device, library versions, kvsieve version, start time, pid) and status
 * 'running'. Runs left 'running' by a process of this host that no longer
 * exists are marked 'abandoned' first. */
kvs_status kvs_store_run_begin(kvs_store *s, const kvs_run_info *info, int64_t *run_id,
                               kvs_err *err);
/* Record that run_id covers shard "I/N" of its grid (runs.shard, schema 4). */
kvs_status kvs_store_run_shard(kvs_store *s, int64_t run_id, const char *shard, kvs_err *err);
/* status: "done", "interrupted" or "failed". */
kvs_status kvs_store_run_end(kvs_store *s, int64_t run_id, const char *status, int64_t n_done,
                             const char *error, kvs_err *err);

/* Where a run's time went (runs columns of schema 5; `kvsieve run` prints
 * it, provenance.json reports it per run and summed over runs, so a merged
 * database sums its shards). */
typedef struct {
    int64_t cells;     /* new cells stored by the run (runs.n_done) */
    int64_t requests;  /* task: answered requests (one prefill each); 0 for other kinds */
    double wall_s;     /* the experiment end to end: backend start, prompts, cells, backend stop */
    double cpu_s;      /* user + system seconds of this process and of the children it waited
                        * for (the embedded `kvsieve serve`; a URL backend is not counted) */
    const char *cpu_scope; /* what cpu_s counts, in words (kvs_run_cpu_scope) */
    /* the work's own clocks, summed: task, the server's per request (its one
     * prefill, every variant's compression, the batch's longest decode);
     * fidelity, compress + apply per cell; overhead, 0 */
    double prefill_ms, compress_ms, decode_ms;
} kvs_run_account;

/* Store a's columns in run_id's row (wall_s, cpu_s, cpu_scope, requests,
 * prefill_ms, compress_ms, decode_ms). */
kvs_status kvs_store_run_account(kvs_store *s, int64_t run_id, const kvs_run_account *a,
                                 kvs_err *err);

typedef struct {
    const char *name;
    double value;
} kvs_score;

typedef struct {
    const char *key, *experiment, *kind, *definition;
    const char *model, *model_hash, *dataset, *dataset_version, *sample_id, *shape;
    int64_t n_tokens, seed;
    const char *method, *label, *params_json;
    double budget_ratio;   /* 0 when a token budget */
    int64_t budget_tokens; /* 0 when a ratio */
    const char *prompt_hash;
    int64_t model_bytes; /* the model file's size (cells.model_bytes, schema 4); 0: unknown */
} kvs_cell_row;

typedef struct {
    const char *prediction; /* NULL for offline kinds */
    double prefill_ms, compress_ms, decode_ms;
    int64_t decode_tokens, kv_bytes_before, kv_bytes_after;
    const char *note;
    int n_scores;
    const kvs_score *scores;
} kvs_result_row;

/* Store n finished cells in ONE transaction (BEGIN IMMEDIATE ... COMMIT):
 * the cell definitions, their results and scores. A cell already finished
 * (by another process) is left as it is. */
kvs_status kvs_store_put(kvs_store *s, int64_t run_id, const kvs_cell_row *cells,
                         const kvs_result_row *results, int n, kvs_err *err);

/* *done = 1 when a result for the key exists. */
kvs_status kvs_store_is_done(kvs_store *s, const char *key, int *done, kvs_err *err);

typedef struct {
    const char *cell_key; /* may be NULL */
    const char *method, *params_json, *device, *shape, *dtype;
    int64_t n_tokens, repetitions;
    double median_ms, p10_ms, p90_ms;
    double bytes_moved, gbps;
} kvs_latency_row;

kvs_status kvs_store_put_latency(kvs_store *s, int64_t run_id, const kvs_latency_row *rows, int n,
                                 kvs_err *err);

/* One `kvsieve bench` run (table engine_bench, schema version 3): the
 * engine's prefill and decode throughput for one model, prompt length and
 * thread count, summarised over `repetitions` timed runs. Its provenance is
 * a runs row of kind "bench" (kvs_store_run_begin). */
typedef struct {
    const char *model;        /* general.name or the file name */
    const char *model_sha256; /* 64 hex characters of the model file */
    const char *model_path;   /* may be NULL */
    const char *arch, *quant_types; /* "gemma3", "Q4_K Q5_0 Q6_K Q8_0 F32" */
    const char *device;       /* "cpu" (NULL: "cpu") */
    int64_t prompt_len, gen_tokens, threads, repetitions;
    /* wall-clock tokens/s over the repetitions: median, 10th, 90th percentile */
    double prefill_tok_s, prefill_tok_s_p10, prefill_tok_s_p90;
    double decode_tok_s, decode_tok_s_p10, decode_tok_s_p90;
    /* median tokens / (CPU seconds / threads): the rate with the cores to itself */
    double prefill_cpu_tok_s, decode_cpu_tok_s;
    double load_avg_before;   /* 1-minute load average before timing; < 0: unknown */
    const char *host_cpu;     /* CPU model name (NULL: read from /proc/cpuinfo) */
    const char *build_type;   /* "release", "debug", "+asan" suffix */
} kvs_engine_bench_row;

/* Insert one engine_bench row for run_id (a runs row must exist). *row_id
 * (may be NULL) gets its id. Errors name the database path. */
kvs_status kvs_store_put_engine_bench(kvs_store *s, int64_t run_id, const kvs_engine_bench_row *row,
                                      int64_t *row_id, kvs_err *err);
/* The CPU model name of this host ("unknown" when /proc/cpuinfo has none). */
void kvs_store_host_cpu(char *out, size_t n);

/* ---- Merging result databases (eval/store_merge.c) -------------------------- */

/* What a merge does with a cell key whose results differ between databases. */
typedef enum {
    KVS_MERGE_REFUSE = 0,     /* list the conflicts, merge nothing, fail (the default) */
    KVS_MERGE_KEEP_FIRST = 1, /* keep the result met first (OUT, then inputs in order) */
    KVS_MERGE_KEEP_LAST = 2   /* keep the result met last (it replaces the earlier one) */
} kvs_merge_keep;

typedef struct {
    int64_t runs_copied, runs_known;  /* runs rows copied / already in OUT (the same run) */
    int64_t cells_copied, cells_same; /* results copied / identical duplicates left out */
    int64_t conflicts, replaced;      /* keys whose results differ / replaced (KEEP_LAST) */
    int64_t latency_copied, bench_copied;
} kvs_merge_summary;

/* Union the results databases inputs[0..n) into out (opened with
 * kvs_store_open, so at the current schema version); every input must be a
 * kvsieve database at the current schema version too (an older one is
 * refused, naming its version: open it once with this kvsieve, e.g.
 * `kvsieve report --db IN`, to migrate it) and is only read.
 *   - runs: every runs row is copied with a new id and merged_from =
 *     "INPUT#ID" (an input's own merged_from is kept: it names the origin);
 *     a run already in out (same host, pid, started_at, experiment, kind and
 *     config hash) is not copied again, so merging twice changes nothing.
 *   - cells, results, scores: copied under the same cell keys, results
 *     pointing at the new run ids. A key present in both is compared on
 *     its values: cell definition, prediction, decode_tokens, KV bytes and
 *     every score except timings (scores named *_ms or *_tok_s; the result
 *     columns prefill_ms, compress_ms, decode_ms, note and finished_at).
 *     Equal values: a duplicate, left out. Different values: a conflict,
 *     listed on log with both values and where each came from; then keep
 *     decides (REFUSE: nothing is written and KVS_ERR_INVALID is returned).
 *   - latency and engine_bench rows: copied with their run (newly copied
 *     runs only), except latency rows of a cell whose result was left out.
 * The conflict check reads every input before anything is written; the
 * writes are one transaction per input. log may be NULL. */
kvs_status kvs_store_merge(kvs_store *out, const char *const *inputs, int n_inputs,
                           kvs_merge_keep keep, FILE *log, kvs_merge_summary *sum, kvs_err *err);

/* ---- Running -------------------------------------------------------------- */

typedef struct {
    int dry_run;
    int threads_override;            /* > 0 overrides the config's threads */
    volatile sig_atomic_t *stop;     /* set (by a SIGINT handler) to stop after the cell in flight */
    FILE *progress;                  /* NULL: silent */
    int progress_tty;                /* 1: one updating line; 0: a plain line every few seconds */
    double progress_every_s;         /* non-TTY interval (default 5) */
    const char *resume_hint;         /* command printed when stopped early */
    int max_cells;                   /* > 0: stop after this many new cells (tests) */
    const char *kvsieve_bin;         /* task, embedded backend: the kvsieve binary to start as
                                      * `kvsieve serve` (NULL: embedded backends are refused) */
    const char *only_experiment;     /* non-NULL: run only the experiment of this name */
    int shard_index, shard_count;    /* shard_count > 1: only the cells of shard shard_index
                                      * (0-based, kvs_shard_of); the others are not in the grid
                                      * of this run (not run, not counted) */
} kvs_run_opts;

typedef struct {
    int64_t run_id;
    int n_cells, n_already, n_done, n_failed;
    int interrupted;
    /* summed over the runs this call started (each is also stored in its runs
     * row); cpu_scope: the last run's. A task run adds its server clocks and
     * requests here; kvs_run_config adds the rest. */
    kvs_run_account acct;
} kvs_run_summary;

/* What cpu_s of an experiment's run counts (static text). */
const char *kvs_run_cpu_scope(const kvs_experiment *e);
/* One line: cells, wall and CPU seconds, cells per CPU-second, and the
 * prefill / compress / decode shares of their sum. */
void kvs_run_account_print(FILE *f, const kvs_run_account *a);

/* Run (or, dry_run, describe on opts->progress) every experiment of a
 * config against the store. Finished cells are skipped; each new cell is
 * committed when it finishes. */
kvs_status kvs_run_config(kvs_store *s, const kvs_config *cfg, const kvs_run_opts *opts,
                          kvs_run_summary *sum, kvs_err *err);

/* ---- Reports -------------------------------------------------------------- */

typedef enum { KVS_REPORT_MD = 0, KVS_REPORT_LATEX, KVS_REPORT_CSV, KVS_REPORT_JSON } kvs_report_format;

typedef struct {
    const char *experiment; /* NULL: every experiment */
    int64_t run_id;         /* > 0: only results written by this run */
    kvs_report_format format;
    int bootstrap;          /* resamples (default 1000) */
    uint64_t seed;          /* bootstrap seed (default 20260) */
} kvs_report_opts;

kvs_status kvs_report_write(kvs_store *s, const kvs_report_opts *o, FILE *out, kvs_err *err);
/* Plot with gnuplot (a child process): score vs budget for fidelity/task
 * experiments, overhead vs N on log-log axes when latency rows exist.
 * Format from the extension (.svg or .png). */
kvs_status kvs_report_plot(kvs_store *s, const kvs_report_opts *o, const char *path, kvs_err *err);

/* The leaderboard of one task experiment of RULER scores (o->experiment
 * required; experiments/leaderboard.lua) into the folder dir (created):
 * scores.csv, summary.md, leaderboard.svg, tasks.svg, provenance.json
 * (eval/report_board.c says what each holds). note (NULL: none) is printed
 * under summary.md's title (what the data is: "a slice: ..."). Output is a
 * function of the database, o->bootstrap and o->seed only. */
kvs_status kvs_report_board(kvs_store *s, const kvs_report_opts *o, const char *dir, const char *note,
                            kvs_err *err);
/* The decode-speed study (eval/report_decode.c, experiments/decode.lua): for
 * the task cells decoded to a fixed length (ignore_eos), per experiment,
 * model, prompt-length class (tokens rounded to a power of two) and budget:
 * decode tokens/s, the speed-up against `full` on the same prompts (mean and
 * bootstrap CI of the per-prompt ratio) and the speed-up predicted from the
 * bytes a decode step reads, (W + KV_full) / (W + KV_kept), W =
 * cells.model_bytes, KV = results.kv_bytes_after. Markdown or LaTeX tables,
 * or for JSON a `, "decode": [...]` member to write inside the report's
 * object (before its closing brace); nothing for CSV or when there are no
 * such cells. *n_rows (may be NULL) gets the table rows written. report.c
 * calls it after its other tables. */
kvs_status kvs_report_decode(kvs_store *s, const kvs_report_opts *o, FILE *out, int *n_rows,
                             kvs_err *err);
/* Its plot: speed-up measured (with CI) and predicted vs kept ratio, a pair of
 * lines per length class, one file per experiment: PATH less its extension,
 * "-EXPERIMENT", the extension (.svg or .png). *n_files (may be NULL) gets
 * how many were written (0: no such cells). Needs gnuplot when there is
 * something to plot. */
kvs_status kvs_report_decode_plot(kvs_store *s, const kvs_report_opts *o, const char *path,
                                  int *n_files, kvs_err *err);

/* ---- Statistics (stats.c: bootstrap CIs; the report's method comparisons) - */

/* Mean and percentile-bootstrap 95% CI of x[0..n), deterministic in seed. */
void kvs_bootstrap_ci(const double *x, int n, int resamples, uint64_t seed, double *mean,
                      double *lo, double *hi);
/* The same for the weighted mean sum w x / sum w (w NULL: all 1, exactly
 * kvs_bootstrap_ci); each resample draws the same indices as the unweighted
 * one. The report weighs decode_tok_s by each request's decode time, so its
 * mean is total tokens / total decode time, not a mean of per-request rates
 * (which favours short answers). */
void kvs_bootstrap_ci_weighted(const double *x, const double *w, int n, int resamples,
                               uint64_t seed, double *mean, double *lo, double *hi);

/* Exact two-sided McNemar test on b and c discordant pairs: Binomial(b + c,
 * 1/2), p = min(1, 2 P[X <= min(b, c)]); 1 when b + c = 0, NaN for b or c
 * < 0. E.g. b = 7, c = 1: 2 * 9 / 256 = 0.0703125. */
double kvs_mcnemar_exact_p(int64_t b, int64_t c);
/* Two-sided paired sign-flip permutation test of mean(d) = 0 (Monte Carlo,
 * resamples random sign patterns, deterministic in seed): (1 + #{|sum s_i
 * d_i| >= |sum d_i|}) / (1 + resamples); 1 when every d is 0. */
double kvs_signflip_p(const double *d, int n, int resamples, uint64_t seed);
/* Holm-Bonferroni step-down adjusted p-values of the non-NaN p[0..n) (m of
 * them): sorted ascending, adj_(i) = max_{j <= i} min(1, (m - j) p_(j))
 * (0-based j); NaN stays NaN. A test is significant at level a after the
 * correction when adj <= a. */
void kvs_holm_adjust(const double *p, int n, double *adj);
/* Mean of x - y over n pairs and its percentile-bootstrap 95% CI, resampling
 * pairs (the same resample for both methods): kvs_bootstrap_ci of the
 * differences. */
void kvs_paired_bootstrap_ci(const double *x, const double *y, int n, int resamples, uint64_t seed,
                             double *mean, double *lo, double *hi);
/* z_{1 - alpha/2} + z_{power} (1.959964 + 0.841621 = 2.801585 for 0.05, 0.8). */
double kvs_power_z(double alpha, double power);
/* Smallest difference a two-sided level-alpha test detects with the given
 * power, normal approximation (formulas in stats.c):
 *   paired 0/1 outcomes, discordance rate p_disc: z sqrt(p_disc / n);
 *   paired means, sd of the differences:        z sd_diff / sqrt(n).
 * NaN when not defined (n too small, p_disc or sd_diff 0). */
double kvs_mde_paired_binary(int n, double p_disc, double alpha, double power);
double kvs_mde_paired_mean(int n, double sd_diff, double alpha, double power);

#ifdef __cplusplus
}
#endif
#endif
