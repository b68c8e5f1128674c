/*
 * report_internal.h -- what the files of `kvsieve report` share (report.c,
 * report_data.c, report_layout.c, report_format.c, report_paired.c,
 * report_perf.c, report_plot.c): the gathered data set, a table's layout,
 * the timing rows, and the functions that read, order and format them.
 * Internal to eval/; not part of the public API (kvs_eval.h is the manual).
 */
#ifndef KVS_EVAL_REPORT_INTERNAL_H
#define KVS_EVAL_REPORT_INTERNAL_H

#include "kvs_eval.h"

#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>

/* ---- the data set (report_data.c) ------------------------------------------------ */

typedef struct {
    int n, cap;
    char **v;
} names;

typedef struct {
    int exp, budget, label, metric;
    int n, cap;
    double *x; /* [n] values */
    double *w; /* [n] weights, or NULL (all 1): decode_tok_s is weighted by each
                * request's decode time, so its mean is total tokens / total time */
    int *sid;  /* [n] sample of each value (index into dataset.samples) */
    double mean, lo, hi;
} group;

/* Sample ids (cells.sample_id), interned through an open-addressing hash:
 * the paired comparisons match cells of two variants by sample. */
typedef struct {
    names v;
    int *slot; /* [cap] index into v, -1 empty */
    int cap;
} sample_tab;

typedef struct {
    double ratio;
    int64_t tokens;
} bkey;

typedef struct {
    names exps, kinds, labels, methods, metrics;
    names caches;      /* KV cache types of the rows ("" the default f16) */
    int *exp_kind;     /* [exps.n] */
    int *label_method; /* [labels.n] */
    int *label_cache;  /* [labels.n] index into caches: a row is (variant, cache type) */
    bkey *budgets;
    int n_budgets, cap_budgets;
    group *g;
    int n_groups, cap_groups;
    sample_tab samples;
} dataset;

/* A task cell's KV cache type as SQL over cells c: the " kv_cache=T" of its
 * definition's model line (eval/task.c writes it where the type is not the
 * default f16), else ''. Cells of two cache types are two rows of a table. */
#define KVS_RPT_SQL_KV_CACHE                                                                     \
    "CASE WHEN instr(c.definition, ' kv_cache=') > 0 THEN substr(c.definition,"                  \
    " instr(c.definition, ' kv_cache=') + 10, instr(substr(c.definition, instr(c.definition,"    \
    " ' kv_cache=') + 10) || char(10), char(10)) - 1) ELSE '' END"

/* FNV-1a of s continuing from h: the seeds of the bootstraps. */
uint64_t kvs_rpt_fnv1a(const char *s, uint64_t h);
void kvs_rpt_dataset_free(dataset *d);
kvs_status kvs_rpt_sql_fail(sqlite3 *db, kvs_err *err, const char *what);
/* Prepare a report query whose ?1 is the experiment filter (NULL: all) and ?2
 * the run filter (<= 0: all), and bind both from the options. */
kvs_status kvs_rpt_prepare_filtered(sqlite3 *db, const char *sql, const kvs_report_opts *o,
                                    sqlite3_stmt **st, const char *what, kvs_err *err);
/* Make room for one more element in a doubling array (first size `first`). */
kvs_status kvs_rpt_grow(void **rows, int *cap, int n, size_t elem, int first, kvs_err *err);
/* Every non-NULL score of the filtered cells into d's groups. */
kvs_status kvs_rpt_gather(sqlite3 *db, const kvs_report_opts *o, dataset *d, kvs_err *err);
/* Each group's mean and bootstrap CI (o->bootstrap resamples, seeded per group). */
void kvs_rpt_compute(dataset *d, const kvs_report_opts *o);

/* ---- a table's layout (report_layout.c) ------------------------------------------ */

typedef struct {
    int *labels, n_labels;   /* ordered rows */
    int *metrics, n_metrics; /* ordered columns */
    int *budgets, n_budgets; /* ordered tables */
} layout_t;

/* -1: lower is better, +1 higher, 0 not ranked. */
int kvs_rpt_direction(const char *metric);
/* A method's place in the registry (the rows' order); 1000 when unknown. */
int kvs_rpt_method_rank(const char *name);
int kvs_rpt_find_group(const dataset *d, int e, int b, int l, int m);
int kvs_rpt_is_full(const dataset *d, int label);
/* The group of label l for metric m at budget b; full rows come from any budget. */
int kvs_rpt_cell_group(const dataset *d, int e, int b, int l, int m);
/* The `full` row a variant is compared with (same bracketed tag, else any); -1 none. */
int kvs_rpt_full_for(const dataset *d, const int *labels, int n_labels, int l);
kvs_status kvs_rpt_layout(const dataset *d, int e, layout_t *t, kvs_err *err);
void kvs_rpt_layout_free(layout_t *t);
void kvs_rpt_budget_title(const bkey *b, char *out, size_t n);
/* The best mean of metric column m among non-full rows at budget b (NaN: none or unranked). */
double kvs_rpt_best_value(const dataset *d, int e, int b, const layout_t *t, int m);

/* ---- single values in the output formats (report_format.c) ----------------------- */

void kvs_rpt_fmt_num(double v, char *out, size_t n);
void kvs_rpt_tex_escape(FILE *f, const char *s);
void kvs_rpt_csv_field(FILE *f, const char *s);
void kvs_rpt_json_str(FILE *f, const char *s);
void kvs_rpt_json_num(FILE *f, double v);

/* ---- paired comparisons (report_paired.c) ---------------------------------------- */

/* Markdown / LaTeX: the comparisons of one budget's table, under it. */
void kvs_rpt_write_paired(const dataset *d, int e, int b, const layout_t *t, int m, FILE *f,
                          kvs_report_format fmt, int B, uint64_t seed);
/* CSV (a block of its own) and JSON ("paired": [...]) rows; returns the rows written. */
int kvs_rpt_write_paired_long(const dataset *d, FILE *f, kvs_report_format fmt, int B,
                              uint64_t seed);

/* ---- equal memory (report_quant.c) ---------------------------------------------- */

/* Markdown / LaTeX: each quantised `full` row beside the evicted f16 rows of
 * (nearly) the same measured bytes (kv_kept_mb); nothing when the experiment
 * has no quantised full row. */
void kvs_rpt_write_equal_bytes(const dataset *d, int e, const layout_t *t, int primary, FILE *f,
                               kvs_report_format fmt);

/* ---- timing tables (report_perf.c) ----------------------------------------------- */

typedef struct {
    char shape[64], device[32], dtype[16], label[160];
    int64_t n;
    double med, p10, p90;
} lat_row;

typedef struct {
    char model[128], build[32], device[16];
    int64_t run, prompt_len, gen, threads, reps;
    double pf, pf10, pf90, dc, dc10, dc90;
} eng_row;

kvs_status kvs_rpt_gather_latency(sqlite3 *db, const kvs_report_opts *o, lat_row **rows, int *n,
                                  kvs_err *err);
void kvs_rpt_write_latency(const lat_row *rows, int n, FILE *f, kvs_report_format fmt);
kvs_status kvs_rpt_gather_engine(sqlite3 *db, const kvs_report_opts *o, eng_row **rows, int *n,
                                 kvs_err *err);
void kvs_rpt_write_engine(const eng_row *rows, int n, FILE *f, kvs_report_format fmt);

/* ---- the leaderboard export (report_board.c, report_prov.c, report_svg.c) -------- */

/* One task experiment's board: its settings (query_agnostic first), the
 * variants of each (layout order, full first), compressed budgets by ratio
 * (largest first), the RULER tasks present (RULER's order). */
typedef struct {
    const dataset *d;
    int e;                /* the experiment */
    int m_avg;            /* metric "ruler": the average */
    int n_set;
    char set[2][32];      /* setting names */
    int *rows[2];         /* [n_rows[s]] labels of setting s */
    int n_rows[2];
    int *budgets, n_budgets; /* compressed budgets */
    int full_b;           /* full's budget (-1 none) */
    int b_task;           /* the compressed budget nearest 0.25 (-1 none) */
    int *tasks, n_tasks;  /* task metrics */
} board;

/* What the database says about the board's cells beyond the scores. */
typedef struct {
    char model[256], model_hash[128], dataset[64], dataset_version[128];
    int64_t n_cells;
    int n_samples;
    char note[2048];      /* the caller's text for summary.md (e.g. "a slice: ...") */
    int n_params;
    char (*param_label)[200]; /* [n_params] label -> params JSON */
    char (*param_json)[400];
} board_meta;

void kvs_rpt_board_setting(const char *label, char *out, size_t n);
void kvs_rpt_board_name(const char *label, char *out, size_t n);
kvs_status kvs_rpt_board_build(const dataset *d, int e, board *bd, kvs_err *err);
void kvs_rpt_board_free(board *bd);
int kvs_rpt_board_group(const board *bd, int l, int b, int m);
/* report_prov.c: the model, dataset, counts and parameters of the cells. */
kvs_status kvs_rpt_board_meta(sqlite3 *db, const kvs_report_opts *o, board_meta *mt, kvs_err *err);
void kvs_rpt_board_meta_free(board_meta *mt);
const char *kvs_rpt_board_params(const board_meta *mt, const char *label);
kvs_status kvs_rpt_board_provenance(sqlite3 *db, const kvs_report_opts *o, const board *bd,
                                    const board_meta *mt, FILE *f, kvs_err *err);
/* report_svg.c: the plots, plain SVG written here (no gnuplot: byte-stable). */
void kvs_rpt_svg_leaderboard(const board *bd, const board_meta *mt, FILE *f);
void kvs_rpt_svg_tasks(const board *bd, const board_meta *mt, FILE *f);

#endif
