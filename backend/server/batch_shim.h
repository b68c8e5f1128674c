/*
 * batch_shim.h -- TEMPORARY SHIM, delete when the engine's batch API lands.
 *
 * What it is: the batch / extend declarations of the engine contract
 * (HELPERS.md, helper "engine": kvs_batch_new / free / decode and
 * kvs_session_extend), implemented in batch_shim.c on top of the
 * one-sequence API (kvs_session_decode), so the server's scheduler is written
 * against the final API today. Same names and signatures as the contract:
 * merging the engine branch makes them collide at link time, which is the
 * reminder to delete batch_shim.{h,c} and the one include in sched.c.
 * What it is not: batched -- each sequence still reads every weight per step.
 */
#ifndef KVS_BATCH_SHIM_H
#define KVS_BATCH_SHIM_H

#include "kvs_backend.h"

typedef struct kvs_batch kvs_batch;
kvs_status kvs_batch_new(kvs_model *m, int max_seqs, int n_threads, kvs_batch **out, kvs_err *err);
void kvs_batch_free(kvs_batch *b);
kvs_status kvs_batch_decode(kvs_batch *b, kvs_session *const *ss, const int32_t *tokens, int n,
                            float *logits, kvs_err *err);
kvs_status kvs_session_extend(kvs_session *s, const int32_t *tokens, int n, float *logits, kvs_err *err);

#endif
