/*
 * kvs_task.h -- the `task` kind of the runner (eval/task.c), called by
 * runner.c for every experiment of kind task.
 *
 * Grid: dataset samples x prompt modes x (method, params) variants x budgets
 * (`full` once per sample and mode). A cell's key is the SHA-256 of its
 * definition: experiment, model name and model hash, dataset name, version
 * and content hash, sample id, prompt template name and hash, mode,
 * n_predict and stop (per sample for ruler{}; ignore_eos when set), method,
 * every parameter value, budget. One request per (sample, mode) carries its
 * pending variants, up to variants_per_request (one prefill, many
 * compressions).
 */
#ifndef KVS_TASK_H
#define KVS_TASK_H

#include "kvs_eval.h"

kvs_status kvs_task_run(kvs_store *s, const kvs_config *cfg, const kvs_experiment *e,
                        const kvs_run_opts *o, kvs_run_summary *sum, kvs_err *err);

#endif
