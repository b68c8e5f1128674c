/*
 * kvs_formats.h -- files: safetensors cache dumps, plan JSON, synthetic caches.
 *
 * What it is: the only place that turns kvsieve's in-memory types into bytes
 * on disk and back. What it is not: no compression logic (core/, methods/),
 * no experiment storage (eval/).
 *
 * Dump layout (stable; other tools write it):
 *   layers.{l}.k      [Hkv, N, d]   F32 | F16 | BF16   post-RoPE keys
 *   layers.{l}.v      [Hkv, N, d]
 *   layers.{l}.q      [Hq, Nq, d]   optional: queries of the last Nq positions
 *   layers.{l}.probe  [Hq, P, d]    optional: probe queries after the prompt
 *                                   (fidelity scoring; never shown to methods)
 *   layers.{l}.wo     [Hq, E, d]    optional, F32 | F16 | BF16: the layer's output
 *                                   projection W_o, head i's [E][d] slice
 *                                   (kvs_layer.wo; CriticalKV's need)
 *   layers.{l}.recon  [Hkv, N]  F32 optional: KVzip's context-reconstruction
 *                                   statistic, each value in [0, 1]
 *                                   (kvs_layer.attn_recon_max)
 *   modality          [N]  U8       optional: 0 text, 1 image
 *   outliers          [M]  I32      optional: planted outlier token indices
 * Optional per-layer tensors are in every layer or in none. q, probe and wo
 * agree on Hq (a multiple of Hkv); E >= 1 is the same in every layer.
 * The `__metadata__` object carries string facts (generator, seed, preset).
 */
#ifndef KVS_FORMATS_H
#define KVS_FORMATS_H

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors ---------------------------------------------------------- */

#define KVS_ST_MAX_DIMS 8

typedef struct {
    char *name;
    kvs_dtype dtype; /* F32, F16, BF16, U8, I32 (others: KVS_ERR_UNSUPPORTED) */
    int ndim;
    int64_t shape[KVS_ST_MAX_DIMS];
    const void *data; /* points into the file's mapping (read) or caller memory (write) */
    size_t nbytes;
} kvs_st_tensor;

typedef struct {
    int n_tensors;
    kvs_st_tensor *tensors;
    char *metadata_json; /* the "__metadata__" object as JSON text, or NULL */
    void *map;           /* mmap of the file */
    size_t map_size;
} kvs_st_file;

/* mmap and parse a file. Every malformed case is KVS_ERR_FORMAT with a message
 * naming the path and what is wrong (header length past end of file, bad
 * JSON, offsets out of range or overlapping, shape/dtype size mismatch, ...). */
kvs_status kvs_st_open(const char *path, kvs_st_file *f, kvs_err *err);
void kvs_st_close(kvs_st_file *f);
const kvs_st_tensor *kvs_st_find(const kvs_st_file *f, const char *name);
/* Value of a string key in __metadata__, copied into buf (truncated to n-1
 * chars); returns buf, or NULL when the key is absent. */
const char *kvs_st_meta(const kvs_st_file *f, const char *key, char *buf, size_t n);

/* Write tensors (data from caller memory) and optional metadata pairs
 * (meta_kv = {"key", "value", ..., NULL}). Writes to path.tmp then renames,
 * so a crash never leaves a half-written file under the final name. The
 * header lists tensors by name and is padded with spaces so the data starts
 * on an 8-byte boundary; data is laid out by element size (4-byte types
 * first), so every tensor is aligned and there are no gaps. Errors
 * (KVS_ERR_INVALID for bad tensors or duplicate names, KVS_ERR_IO) name the
 * path. */
kvs_status kvs_st_write(const char *path, const kvs_st_tensor *t, int n, const char *const *meta_kv,
                        kvs_err *err);

/* ---- cache dumps ----------------------------------------------------------- */

typedef struct {
    kvs_st_file file;
    kvs_cache_view view;    /* layers point into the mapping */
    kvs_layer *layers;      /* [L] storage for view.layers */
    kvs_view *probes;       /* [L] probe views (data NULL when absent) */
    const int32_t *outliers; /* [n_outliers] or NULL */
    int n_outliers;
    kvs_shape shape;        /* validated (threads = 1) */
} kvs_dump;

/* Open and validate a dump: tensor names, shapes that agree across layers
 * and between k/v/q/probe/wo/recon, dtypes, modality length and values,
 * outliers sorted and in range, finite values, recon in [0, 1]. Errors name
 * the file and the tensor (and the head and token of a bad recon value).
 * Unknown tensor names are errors. A compressed cache (layers of different
 * lengths) does not open as a dump; read it with kvs_st_open. When the dump
 * has probes but no queries, shape.n_q_heads is the probes' Hq. Each view
 * layer's wo and attn_recon_max point at layers.{l}.wo / .recon when the
 * dump has them (data NULL / NULL otherwise). */
kvs_status kvs_dump_open(const char *path, kvs_dump *d, kvs_err *err);
void kvs_dump_close(kvs_dump *d);

/* Write a dense (fp32) cache as a dump, converting K/V/Q to dtype
 * (F32/F16/BF16); probes stay F32 (few, and fidelity wants them exact).
 * probes ([L] fp32 [Hq][P][d] arrays, may be NULL), outliers may be NULL.
 * modality is written when c->modality is set ([c->n_tokens] U8).
 * A compressed cache (layers of different lengths) is written as-is:
 * layers.{l}.k is [Hkv, B_l, d]. */
kvs_status kvs_dump_write(const char *path, const kvs_dense_cache *c, kvs_dtype dtype,
                          const float *const *probes, int n_probes, int n_q_heads,
                          const int32_t *outliers, int n_outliers, const char *const *meta_kv,
                          kvs_err *err);

/* What a dense cache does not hold but a dump may: W_o and the
 * reconstruction statistic, [L] fp32 arrays each (NULL: not written). */
typedef struct {
    const float *const *wo;    /* [L] of [Hq][E][d]: layers.{l}.wo, in the dump's dtype */
    int wo_heads, wo_rows;     /* Hq (a multiple of Hkv), E */
    const float *const *recon; /* [L] of [Hkv][N_l], values in [0, 1]: layers.{l}.recon, F32 */
} kvs_dump_extra;

/* kvs_dump_write plus extra (may be NULL: then the same file). A NULL
 * array, Hq not a multiple of Hkv or a recon value outside [0, 1] is
 * KVS_ERR_INVALID naming the layer (and head and token). */
kvs_status kvs_dump_write_extra(const char *path, const kvs_dense_cache *c, kvs_dtype dtype,
                                const float *const *probes, int n_probes, int n_q_heads,
                                const int32_t *outliers, int n_outliers, const kvs_dump_extra *extra,
                                const char *const *meta_kv, kvs_err *err);

/* ---- plans as JSON -------------------------------------------------------- */

/* {"method": M, "params": {...}, "n_tokens": N, "merge": "none",
 *  "layers": [{"budget": B_l, "heads": [[...], ...]}, ...]}
 * A ragged layer adds "counts": [c_0, ..., c_{Hkv-1}] (sum Hkv * B_l) and
 * head h's array holds c_h indices; files without "counts" are dense.
 * Returns malloc'd text (caller frees) or NULL on allocation failure. */
char *kvs_plan_to_json(const kvs_plan *p, const kvs_method *m, const kvs_params *params);
/* Parse and check (kvs_plan_check) a plan; errors name the JSON field. */
kvs_status kvs_plan_from_json(const char *text, kvs_plan *p, kvs_err *err);

/* ---- synthetic caches ------------------------------------------------------ */

/* Version of the generator's output: bump it whenever kvs_synth_generate
 * produces different numbers for the same config, so results stored for the
 * old data are not reused (it is part of every synthetic cell's key). */
#define KVS_SYNTH_VERSION "1"

typedef struct {
    char preset[32];     /* "" for custom */
    int n_layers, n_q_heads, n_kv_heads, head_dim;
    int n_tokens;        /* N */
    int n_queries;       /* Nq: 0 none, N all, else the last Nq positions */
    int n_probes;        /* P probe queries per layer (default 16) */
    int n_outliers;      /* planted outlier tokens; -1 (the default): max(4, N/256),
                            at most N - n_sinks */
    int n_sinks;         /* attention-sink tokens at the start (default 4) */
    double image_frac;   /* share of tokens in image spans (default 0) */
    double rope_theta;   /* default 10000 */
    uint64_t seed;
} kvs_synth_config;

/* Shape presets: "qwen2.5-vl-7b", "llava-1.5-7b", "gemma3-270m", "tiny"
 * (2 layers, Hq 4, Hkv 2, d 16). Fills shape fields and defaults; the caller
 * sets n_tokens, seed, n_queries. Unknown names list the known ones. */
kvs_status kvs_synth_preset(const char *name, kvs_synth_config *cfg, kvs_err *err);
/* Defaults for everything but shape and N: n_probes 16, n_outliers -1
 * (auto), n_sinks 4, image_frac 0, rope_theta 10000, seed 0, n_queries 0.
 * Presets also set rope_theta (qwen2.5-vl-7b, gemma3-270m: 1e6). */
void kvs_synth_defaults(kvs_synth_config *cfg);

/* Generate a synthetic cache (fp32) with the structure real caches have:
 * per channel a smooth low-frequency signal along tokens (a few random
 * low DCT modes), plus small noise; RoPE applied to keys at their
 * positions; sink tokens with large keys that attract attention; planted
 * outlier tokens whose K and V deviate strongly from the smooth base; image
 * spans whose tokens are smoother (more redundant) than text. Queries are
 * drawn around the keys' mean direction, RoPE-rotated at their positions;
 * probes partly aim at outlier keys (like a question about a needle).
 * Deterministic in cfg->seed (K/V/Q do not depend on whether probes or
 * outliers are requested). probes_out: [L] arrays [Hq][P][d] (caller frees
 * each and the array; NULL when P = 0); outliers_out [n_outliers] sorted
 * (caller frees). Either may be NULL. out->modality is NULL when
 * image_frac = 0. How the structure is made: see formats/synth.c. */
/* Validate cfg and resolve its automatic fields in place (n_outliers = -1
 * becomes the actual count), so callers can print and store real numbers. */
kvs_status kvs_synth_resolve(kvs_synth_config *cfg, kvs_err *err);

kvs_status kvs_synth_generate(const kvs_synth_config *cfg, kvs_dense_cache *out, float ***probes_out,
                              int32_t **outliers_out, kvs_err *err);

/* The model-side tensors a dump may carry (kvs_dump_extra), for the cache
 * kvs_synth_generate makes from the same cfg (its outlier list, sorted, may
 * be NULL with n_outliers 0): wo_out gets [L] arrays [Hq][E = wo_rows][d]
 * (W_o: random rows, a different scale per query head), recon_out [L]
 * arrays [Hkv][N] in (0, 1) (high on sinks and outliers, levels that differ
 * by layer and head, smooth along tokens plus noise). Either may be NULL
 * (not made); the caller frees each array and the list. Seeded by cfg->seed
 * from streams of their own: asking for them changes nothing else. How the
 * structure is made: see formats/synth_extra.c. */
kvs_status kvs_synth_extra(const kvs_synth_config *cfg, const int32_t *outliers, int n_outliers, int wo_rows,
                           float ***wo_out, float ***recon_out, kvs_err *err);

#ifdef __cplusplus
}
#endif
#endif
