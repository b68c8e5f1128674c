/*
 * overhead.h -- private interface of eval/overhead.c (kind `overhead`, the
 * latency study of performance.md section 1) for eval/runner.c, and the
 * max_tokens rule for eval/grid.c (which cells exist).
 *
 * What it is: a context that holds the synthetic input sets of the current
 * (shape, N, dtype), the host copy bandwidth measured once per run, and the
 * CUDA state when a device is used; one call times one cell and stores its
 * rows (latency table + a cells/results row that makes resume exact).
 * What it is not: no grid expansion (grid.c), no run bookkeeping
 * (runner.c), no report (report.c). Not installed, not public.
 */
#ifndef KVS_EVAL_OVERHEAD_H
#define KVS_EVAL_OVERHEAD_H

#include "kvs_eval.h"

typedef struct kvs_overhead kvs_overhead;

/* Measure the host copy bandwidth, read the CPU model; log lines go to
 * `log` (may be NULL), `tty` says whether it is a terminal (a progress line
 * may be open on it). */
kvs_status kvs_overhead_begin(const kvs_experiment *e, FILE *log, int tty, kvs_overhead **out,
                              kvs_err *err);
/* Time one cell (warm-up, then e->repeats runs rotated over the input
 * sets, plus the dominant-term micro-benchmark on CPU) and store it. */
kvs_status kvs_overhead_cell(kvs_overhead *x, const kvs_experiment *e, const kvs_cell *c,
                             kvs_store *s, int64_t run_id, kvs_err *err);
/* Print the per-cell summary (method, N, median, dominant term, ratio) of
 * the cells timed in this run to the log, free everything. NULL is fine. */
void kvs_overhead_end(kvs_overhead *x);

/* max_tokens of (method, shape): -1 none, 0 never, else the largest N
 * that runs (grid.c leaves the larger cells out; the input sets stop there). */
int kvs_overhead_limit(const kvs_experiment *e, const char *method, const char *shape);

/* "gemma3-270m N=8192 F16 cpu 2t  h2o  budget 0.2" */
void kvs_overhead_label(const kvs_experiment *e, const kvs_cell *c, const char *budget, char *out,
                        size_t n);

#endif
