/*
 * overhead.c -- kind `overhead`: the compression-latency study of
 * performance.md section 1, on CPU (and on CUDA through kernels/).
 *
 * What it is: per cell (shape, N, dtype, device, threads, method variant,
 * budget) it times the whole compression step -- kvs_compress (validation,
 * scoring, budget allocation, selection) + kvs_apply (compaction, merging),
 * all layers -- after `warmup` untimed runs, over `repeats` timed runs that
 * rotate over several synthetic input sets (the dataset's seeds; three by
 * default) so caches do not flatter; monotonic clock on CPU, CUDA events on
 * the device. It reports median / p10 / p90, the bytes the step must move
 * (model below), the achieved GB/s against a host copy bandwidth measured in
 * the same run, GFLOP/s for the attention passes, and on CPU the time of the
 * method's dominant term measured by a micro-benchmark in the same cell:
 *   flashcache and every  one orthonormal DCT-II + DCT-III pair over every
 *   preset of its scorer  (layer, K|V, head, channel) column (kernels/dct.h),
 *                         in L2-sized column groups, on the cell's threads;
 *   methods that read     one causal attention pass over all queries
 *   all queries (h2o,     (core's kvs_attn_colsum_fused, every layer);
 *   lookm, meda, ...)
 *   methods that read     the same pass over the window's queries only;
 *   the last queries
 *   (snapkv, tova, ...)
 *   key-only scorers      what a scorer of the keys cannot avoid: the L2
 *   (knorm, keydiff,      norm of every key row (rows converted to fp32 as
 *   lagkv, cur, ...)      the parts do, kvs_view_rows_f32) + the V read and
 *                         gather below: the "one norm pass" of the bar;
 *   the rest (full,       what their contract cannot avoid: one read of every
 *   random, streaming-    K and V byte (kvs_compress's NaN/Inf check) + the
 *   llm)                  gather of the kept rows into fp32 buffers (the plan
 *                         of the timed runs), on the cell's threads.
 * The leverage scorer's presets: the Gaussian sketch its scores cannot
 * avoid, fp32 keys [N][d] x Phi [d][k] per (layer, KV head) (one sgemm; k =
 * sketch_dimension), the keys converted to fp32 as the scorer does.
 * Methods that read W_o (criticalkv, criticaladakv): the projection of every
 * value row by each of its query heads' W_o, what ||W_o v|| cannot avoid:
 * one sgemm [128 tokens][d] x [d][E] per (layer, query head, block) (BLAS
 * threads itself, as the part's does). They get one synthetic
 * [Hq][Hq d][d] projection (seeded, shared by every layer): a synthetic shape
 * has no hidden size, and Hq d is the real one for the two 7B shapes.
 * kvs_apply_into writes into the buffers of the previous run (an engine
 * compacts into its own pool; fresh buffers would time page faults).
 * The performance.md CPU bar is median / dominant <= 2.
 *
 * Bytes-moved model (a lower bound on traffic, stated in every row's note):
 * the cache read once (K and V of every layer in the cell's dtype, plus the
 * queries an attention method reads) + the compacted K and V written (fp32,
 * what kvs_apply produces). GB/s = bytes / median. The host copy bandwidth
 * is a single-thread memcpy of 256 MiB (bytes read + written per second,
 * best of 5). Attention FLOPs: 2 d per (query head, query, visible key) of
 * one causal pass; gflops divides them by the step's median, pass_gflops by
 * the dominant term's (the attention pass alone).
 *
 * Storage: one latency row per cell (device "cpu <T>t <build> <model>",
 * at most 31 characters so the report's tables keep it whole) and a
 * cells/results row with the same key (results.compress_ms = median), which
 * is what resume checks; its note carries everything the latency table has
 * no column for (threads, build type, CPU model, input sets, dominant term
 * and ratio, GB/s of the copy, GFLOP/s). The latency row is written first:
 * a process killed between the two writes re-runs the cell and the report
 * takes the newest latency row.
 *
 * What it is not: no method logic, no plots (report.c), no N x N buffer:
 * beyond the input sets, memory is the plan, one compressed copy and O(N)
 * scratch per head (the DCT micro-benchmark holds at most ~64 MiB of
 * transposed columns, re-used over the layers; FFT cost does not depend on
 * the values).
 */
#define _GNU_SOURCE /* sysconf(_SC_AVPHYS_PAGES) */
#include "overhead.h"

#include "dct.h"
#include "kvs_formats.h"
#include "kvs_kernels.h"
#include "kvs_parts.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVSIEVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#ifndef KVS_BUILD_TYPE
#define KVS_BUILD_TYPE "unknown"
#endif

enum { DOM_GATHER = 0, DOM_DCT = 1, DOM_ATTN = 2, DOM_WO = 3, DOM_SKETCH = 4, DOM_NORM = 5 };
static const char *const dom_names[] = {"cache read + gather", "DCT-II+III pair",  "attention pass",
                                        "W_o projection",      "key sketch",       "key norms + gather"};

/* One finished cell, for the closing summary. */
typedef struct {
    char label[400];
    double med, dom, gbps, gflops;
} oh_done;

/* The input sets of one (shape, N, dtype). */
typedef struct {
    int shape, length, dtype; /* indices into the experiment; -1: none loaded */
    int n_sets, nq;
    kvs_dtype dt;
    int L, N, Hq, Hkv, d;
    void **buf;         /* [n_sets] per layer: K [Hkv][N][d], V [Hkv][N][d], Q [Hq][nq][d] in dt */
    kvs_layer *layers;  /* [n_sets][L] views on buf */
    uint8_t **modality; /* [n_sets] each [N] or NULL */
} oh_inst;

struct kvs_overhead {
    FILE *log;
    int tty;
    char cpu_model[128];
    double copy_gbps; /* host memcpy, bytes read + written per second / 1e9 */
    oh_inst in;
    oh_done *done;
    int n_done, cap_done;
#ifdef KVSIEVE_HAVE_CUDA
    kvs_gpu_workspace *ws;
    kvs_shape ws_shape;
    int dev_shape, dev_length, dev_dtype; /* which instance is on the device */
    void **dbuf;                          /* [dn_sets] device copies of in.buf */
    int dn_sets;
    kvs_layer *dlayers;                   /* [n_sets][L] device views */
    float *dk, *dv;                       /* [Hkv][N][d] apply outputs */
    double dev_copy_gbps;
    char dev_name[128];
#endif
};

/* ---- small helpers ---------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear-interpolated quantile of sorted v[0..n). */
static double quant(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

static void logf_line(kvs_overhead *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_line(kvs_overhead *x, const char *fmt, ...) {
    if (!x->log) return;
    va_list ap;
    va_start(ap, fmt);
    if (x->tty) fputs("\r\033[K", x->log);
    vfprintf(x->log, fmt, ap);
    va_end(ap);
    fflush(x->log);
}

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ') c++;
        c[strcspn(c, "\r\n")] = '\0';
        snprintf(out, n, "%s", c);
        break;
    }
    fclose(f);
}

/* Single-thread memcpy of 256 MiB, best of 5 after one untimed copy. */
static kvs_status host_copy_bandwidth(double *gbps, kvs_err *err) {
    const size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes); /* [bytes] each */
    if (!a || !b) {
        free(a);
        free(b);
        return kvs_errorf(err, KVS_ERR_NOMEM, "overhead: no memory for the copy-bandwidth buffers");
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e300;
    for (int r = 0; r < 6; r++) {
        double t0 = kvs_now_ms();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, bytes);
        double t = kvs_now_ms() - t0;
        if (r > 0 && t < best) best = t;
    }
    /* keep the copies observable so they are not optimised away */
    volatile char sink = a[bytes / 2] ^ b[bytes / 3];
    (void)sink;
    free(a);
    free(b);
    *gbps = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
    return KVS_OK;
}

/* Bytes of memory available to this process: MemAvailable of
 * /proc/meminfo (free + reclaimable cache), else free pages. */
static double available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long long kb = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
        fclose(f);
        if (kb > 0) return (double)kb * 1024.0;
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (double)pages * (double)psz : 1e18;
}

/* Queries a variant reads at prompt length N. */
static int queries_wanted(const kvs_variant *var, int N) {
    const kvs_method *m = var->method;
    int want = 0;
    if (m->needs & KVS_NEED_Q_ALL)
        want = N;
    else if (m->queries_wanted)
        want = m->queries_wanted(&var->params, N);
    return want > N ? N : want < 0 ? 0 : want;
}

static int dominant_kind(const kvs_method *m) {
    const kvs_composition *comp = kvs_parts_composition(m);
    if (!strcmp(m->name, "flashcache") || (comp && comp->scorer == &kvs_scorer_flashcache)) return DOM_DCT;
    if (comp && comp->scorer == &kvs_scorer_leverage) return DOM_SKETCH;
    if (m->needs & KVS_NEED_W_O) return DOM_WO; /* Hq E d per token: more than the window's attention */
    if (m->needs & (KVS_NEED_Q_ALL | KVS_NEED_Q_WINDOW)) return DOM_ATTN;
    if (comp && comp->scorer != &kvs_scorer_random) return DOM_NORM; /* its scorer reads the keys */
    return DOM_GATHER;
}

/* ---- input sets --------------------------------------------------------------- */

static void inst_free(oh_inst *in) {
    for (int s = 0; in->buf && s < in->n_sets; s++) free(in->buf[s]);
    for (int s = 0; in->modality && s < in->n_sets; s++) free(in->modality[s]);
    free(in->buf);
    free(in->modality);
    free(in->layers);
    memset(in, 0, sizeof *in);
    in->shape = in->length = in->dtype = -1;
}

static void store_elems(kvs_dtype dt, const float *src, size_t n, void *dst) {
    if (dt == KVS_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == KVS_F16) {
        uint16_t *o = dst;
        for (size_t i = 0; i < n; i++) o[i] = kvs_f32_to_f16(src[i]);
    } else {
        uint16_t *o = dst;
        for (size_t i = 0; i < n; i++) o[i] = kvs_f32_to_bf16(src[i]);
    }
}

static kvs_status inst_load(kvs_overhead *x, const kvs_experiment *e, const kvs_cell *c,
                            kvs_err *err) {
    oh_inst *in = &x->in;
    if (in->shape == c->shape && in->length == c->length && in->dtype == c->dtype) return KVS_OK;
    inst_free(in);
    kvs_status rc = KVS_OK;
    kvs_dense_cache dc;
    memset(&dc, 0, sizeof dc);
    const kvs_eval_shape *sh = &e->shapes[c->shape];
    const int N = e->lengths[c->length];
    const kvs_dtype dt = e->n_dtypes > 0 ? e->dtypes[c->dtype] : e->dtype;
    int nq = 0;
    for (int v = 0; v < e->n_variants; v++) { /* what the variants that run at (shape, N) read */
        int lim = kvs_overhead_limit(e, e->variants[v].method->name, sh->name);
        if (lim >= 0 && N > lim) continue;
        int w = queries_wanted(&e->variants[v], N);
        if (w > nq) nq = w;
    }
    kvs_synth_config sc;
    if (strncmp(sh->name, "custom-", 7) == 0) {
        kvs_synth_defaults(&sc);
        sc.n_layers = sh->n_layers, sc.n_q_heads = sh->n_q_heads;
        sc.n_kv_heads = sh->n_kv_heads, sc.head_dim = sh->head_dim;
    } else if ((rc = kvs_synth_preset(sh->name, &sc, err))) {
        return rc;
    }
    sc.n_tokens = N;
    sc.n_queries = nq;
    sc.n_probes = 0;
    if (e->outliers > 0) sc.n_outliers = e->outliers;
    if (e->sinks >= 0) sc.n_sinks = e->sinks;
    sc.image_frac = e->image_frac;
    const int L = sc.n_layers, Hq = sc.n_q_heads, Hkv = sc.n_kv_heads, d = sc.head_dim;
    const size_t per_layer = 2 * (size_t)Hkv * N * d + (size_t)Hq * nq * d; /* elements */
    const double set_bytes = (double)per_layer * L * (double)kvs_dtype_size(dt);
    const double gen_bytes = (double)per_layer * L * 4.0; /* the fp32 cache being generated */
    double avail = 0.8 * available_memory();
    int want_sets = e->n_seeds, n_sets = want_sets;
    while (n_sets > 1 && n_sets * set_bytes + gen_bytes > avail) n_sets--;
    if (n_sets * set_bytes + gen_bytes > avail)
        return kvs_errorf(err, KVS_ERR_NOMEM,
                          "%s N=%d %s: one input set needs %.2f GB (+%.2f GB while generating), "
                          "%.2f GB of memory are available; lower n_tokens or max_tokens",
                          sh->name, N, kvs_dtype_name(dt), set_bytes / 1e9, gen_bytes / 1e9,
                          avail / 1e9);
    if (n_sets < want_sets)
        logf_line(x, "note: %s N=%d %s: %d input sets of %.2f GB do not fit in %.2f GB; rotating "
                     "over %d\n",
                  sh->name, N, kvs_dtype_name(dt), want_sets, set_bytes / 1e9, avail / 1e9, n_sets);
    in->buf = calloc((size_t)n_sets, sizeof *in->buf);
    in->modality = calloc((size_t)n_sets, sizeof *in->modality);
    in->layers = calloc((size_t)n_sets * L, sizeof *in->layers);
    in->n_sets = n_sets;
    if (!in->buf || !in->modality || !in->layers) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    const size_t es = kvs_dtype_size(dt);
    for (int s = 0; s < n_sets; s++) {
        sc.seed = (uint64_t)e->seeds[s];
        if ((rc = kvs_synth_generate(&sc, &dc, NULL, NULL, err))) {
            kvs_err_prefix(err, "generating synthetic cache %s N=%d seed=%lld", sh->name, N,
                           (long long)e->seeds[s]);
            goto cleanup;
        }
        in->buf[s] = malloc(per_layer * L * es);
        if (!in->buf[s]) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for input set %d (%.2f GB)", s,
                            set_bytes / 1e9);
            goto cleanup;
        }
        for (int l = 0; l < L; l++) {
            char *base = (char *)in->buf[s] + (size_t)l * per_layer * es;
            const size_t kvn = (size_t)Hkv * N * d, qn = (size_t)Hq * nq * d;
            store_elems(dt, dc.layers[l].k, kvn, base);
            store_elems(dt, dc.layers[l].v, kvn, base + kvn * es);
            if (nq > 0) {
                assert(dc.layers[l].q && dc.layers[l].n_queries == nq);
                store_elems(dt, dc.layers[l].q, qn, base + 2 * kvn * es);
            }
            kvs_layer *ly = &in->layers[(size_t)s * L + l];
            ly->k = kvs_view_make(base, dt, Hkv, N, d);
            ly->v = kvs_view_make(base + kvn * es, dt, Hkv, N, d);
            if (nq > 0)
                ly->q = kvs_view_make(base + 2 * kvn * es, dt, Hq, nq, d);
            else
                memset(&ly->q, 0, sizeof ly->q);
        }
        if (dc.modality) {
            in->modality[s] = malloc((size_t)N);
            if (!in->modality[s]) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            memcpy(in->modality[s], dc.modality, (size_t)N);
        }
        kvs_dense_cache_free(&dc);
    }
    in->shape = c->shape, in->length = c->length, in->dtype = c->dtype;
    in->nq = nq, in->dt = dt;
    in->L = L, in->N = N, in->Hq = Hq, in->Hkv = Hkv, in->d = d;
cleanup:
    kvs_dense_cache_free(&dc);
    if (rc) inst_free(in);
    return rc;
}

/* The method's view of set s: queries trimmed to the last `want`. */
static void make_work(const oh_inst *in, const kvs_layer *src, int want, kvs_layer *work) {
    for (int l = 0; l < in->L; l++) {
        work[l] = src[l];
        kvs_view *q = &work[l].q;
        if (want == 0) {
            memset(q, 0, sizeof *q);
        } else if (want < in->nq) {
            q->data = (const char *)q->data +
                      (size_t)(in->nq - want) * (size_t)q->s_tok * kvs_dtype_size(q->dtype);
            q->n_tokens = want;
        }
    }
}

/* ---- dominant terms (CPU micro-benchmarks) ------------------------------------ */

/* FlashCache's dominant term: one orthonormal DCT-II + DCT-III pair over
 * every (layer, K|V, head, channel) column, at its best: the input already
 * transposed to [d][N] fp32, the columns of a block taken in groups of G
 * (kvs_dct_plan_group: the group's spectrum and output stay in L2, as in
 * kvs_dct_lowpass_sqres), one (layer, K|V, head) block per unit on the cell's
 * threads. FFT cost does not depend on the values, so at most 64 MiB of real
 * columns are re-used over the blocks. */
typedef struct {
    kvs_dct_plan **plans; /* [T] (N, G) plans, one per worker */
    float *X, *y;         /* [T][G][N] each */
    const float *cols;    /* [nblocks][d][N] transposed columns (read-only) */
    int nblocks, total, T, N, d, G;
} dct_bench;

static kvs_status dct_unit(void *job, int tid, int u, kvs_err *err) {
    dct_bench *b = job;
    const size_t gn = (size_t)b->G * b->N;
    const float *x = b->cols + (size_t)(u % b->nblocks) * b->d * b->N;
    float *X = b->X + (size_t)tid * gn, *y = b->y + (size_t)tid * gn;
    kvs_status st = KVS_OK;
    for (int c = 0; c < b->d && !st; c += b->G)
        if (!(st = kvs_dct2_ortho_cols(b->plans[tid], x + (size_t)c * b->N, X, err)))
            st = kvs_dct3_ortho_cols(b->plans[tid], X, y, err);
    if (st) kvs_err_prefix(err, "DCT micro-benchmark: block %d", u);
    return st;
}

static void dct_bench_free(dct_bench *b) {
    for (int t = 0; b->plans && t < b->T; t++) kvs_dct_plan_destroy(b->plans[t]);
    free(b->plans);
    free(b->X);
    free(b->y);
    free((void *)b->cols);
    memset(b, 0, sizeof *b);
}

static kvs_status dct_bench_init(dct_bench *b, const oh_inst *in, int threads, kvs_err *err) {
    memset(b, 0, sizeof *b);
    const int N = in->N, d = in->d;
    const size_t blk = (size_t)d * N; /* floats per block */
    kvs_dct_plan *probe = NULL;
    float *rows = NULL, *cols = NULL;
    kvs_status rc = kvs_dct_plan_create(N, d, &probe, err);
    if (rc) return rc;
    int G = kvs_dct_plan_group(probe);
    if (G < 1 || G > d || d % G != 0) G = d; /* whole blocks when groups do not tile d */
    kvs_dct_plan_destroy(probe);
    b->N = N, b->d = d, b->G = G;
    b->total = in->L * 2 * in->Hkv;
    b->nblocks = (int)((64u << 20) / (blk * sizeof(float)));
    if (b->nblocks < 1) b->nblocks = 1;
    if (b->nblocks > b->total) b->nblocks = b->total;
    b->T = kvs_parallel_threads(threads, b->total);
    cols = malloc(blk * b->nblocks * sizeof(float));               /* [nblocks][d][N] */
    rows = malloc(blk * sizeof(float));                            /* [N][d] one head */
    b->plans = calloc((size_t)b->T, sizeof *b->plans);             /* [T] */
    b->X = malloc(sizeof(float) * (size_t)b->T * G * N);          /* [T][G][N] */
    b->y = malloc(sizeof(float) * (size_t)b->T * G * N);          /* [T][G][N] */
    b->cols = cols;
    if (!cols || !rows || !b->plans || !b->X || !b->y) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for the DCT micro-benchmark");
        goto cleanup;
    }
    for (int i = 0; i < b->nblocks; i++) {
        int l = i / (2 * in->Hkv), kv = (i / in->Hkv) % 2, h = i % in->Hkv;
        const kvs_view *v = kv ? &in->layers[l].v : &in->layers[l].k;
        kvs_view_rows_f32(v, h, 0, N, rows);
        kvs_transpose_f32(rows, N, d, cols + (size_t)i * blk);
    }
    for (int t = 0; t < b->T; t++)
        if ((rc = kvs_dct_plan_create(N, G, &b->plans[t], err))) goto cleanup;
cleanup:
    free(rows);
    if (rc) dct_bench_free(b);
    return rc;
}

static kvs_status dct_bench_run(dct_bench *b, kvs_err *err) {
    return kvs_parallel_run(b, dct_unit, b->total, b->T, "DCT micro-benchmark", err);
}

/* The dominant term of the index-only methods (full, random, StreamingLLM):
 * what their contract cannot avoid, one read of every K and V byte (the
 * NaN/Inf check kvs_compress must do) and the gather of the kept rows into
 * fp32 buffers; one (layer, K|V) unit each, on the cell's threads. The read
 * XORs 64-bit words (no NaN logic: a plain streaming read). */
typedef struct {
    const kvs_layer *ly;
    const kvs_plan *p;
    float *out; /* [L][2][Hkv][maxB][d] */
    int maxB;
    float *norms, *rows; /* DOM_NORM: [L][Hkv][N] key norms, [T][64][d] rows; else NULL */
    uint64_t sink[64]; /* per worker, so the reads are not optimised away */
} gather_job;

static uint64_t read_words(const kvs_view *x) {
    const size_t es = kvs_dtype_size(x->dtype);
    uint64_t acc = 0;
    for (int h = 0; h < x->n_heads; h++) {
        /* make_work's views are [Hkv][N][d] contiguous per head */
        const size_t bytes = (size_t)x->n_tokens * (size_t)x->s_tok * es;
        const char *w = (const char *)x->data + (size_t)h * x->s_head * es;
        for (size_t i = 0; i + 8 <= bytes; i += 8) {
            uint64_t word; /* memcpy: the head need not be 8-byte aligned */
            memcpy(&word, w + i, 8);
            acc ^= word;
        }
    }
    return acc;
}

/* The key norms of DOM_NORM: rows in tiles of 64, kvs_part_sumsq (the
 * scorers' reduction), out [Hkv][N]. */
static void key_norms(const kvs_view *x, float *rows, float *out) {
    const int N = x->n_tokens, d = x->head_dim;
    for (int h = 0; h < x->n_heads; h++)
        for (int n0 = 0; n0 < N; n0 += 64) {
            const int cnt = N - n0 < 64 ? N - n0 : 64;
            kvs_view_rows_f32(x, h, n0, cnt, rows);
            for (int i = 0; i < cnt; i++)
                out[(size_t)h * N + n0 + i] = sqrtf(kvs_part_sumsq(rows + (size_t)i * d, d));
        }
}

static kvs_status gather_unit(void *job, int tid, int u, kvs_err *err) {
    (void)err;
    gather_job *g = job;
    const int l = u / 2, is_v = u % 2;
    const kvs_view *x = is_v ? &g->ly[l].v : &g->ly[l].k;
    const int Hkv = x->n_heads, d = x->head_dim;
    if (g->norms && !is_v)
        key_norms(x, g->rows + (size_t)tid * 64 * d, g->norms + (size_t)l * Hkv * x->n_tokens);
    else
        g->sink[tid] ^= read_words(x);
    for (int h = 0; h < Hkv; h++) {
        int B;
        const int32_t *idx = kvs_plan_head(g->p, l, h, &B); /* [B]: ragged plans, each head its own */
        float *o = g->out + (((size_t)(2 * l + is_v) * Hkv + h) * g->maxB) * d; /* [B][d] */
        kvs_view_gather_f32(x, h, idx, B, o);
    }
    return KVS_OK;
}

static kvs_status gather_run(const kvs_layer *ly, int L, const kvs_plan *p, float *out, int maxB,
                             float *norms, float *rows, int threads, kvs_err *err) {
    gather_job g = {.ly = ly, .p = p, .out = out, .maxB = maxB, .norms = norms, .rows = rows};
    kvs_status st = kvs_parallel_run(&g, gather_unit, 2 * L, threads, "dominant term", err);
    volatile uint64_t keep = 0; /* keeps the reads live */
    for (int t = 0; t < 64; t++) keep ^= g.sink[t];
    (void)keep;
    return st;
}

/* The dominant term of the W_o readers: V rows [N][d] (fp32) x W_o^T
 * [d][E] for every (layer, query head), in blocks of 128 tokens into prod
 * [128][E]; vrows [N][d]. The synthetic W_o is contiguous [Hq][E][d]. */
static void wo_run(const kvs_layer *ly, int L, float *vrows, float *prod) {
    for (int l = 0; l < L; l++) {
        const kvs_view *v = &ly[l].v, *wo = &ly[l].wo;
        const int H = v->n_heads, N = v->n_tokens, d = v->head_dim, G = wo->n_heads / H, E = wo->n_tokens;
        for (int h = 0; h < H; h++) {
            kvs_view_rows_f32(v, h, 0, N, vrows);
            for (int g = 0; g < G; g++) {
                const float *w = (const float *)wo->data + (size_t)(h * G + g) * (size_t)wo->s_head;
                for (int j0 = 0; j0 < N; j0 += 128) {
                    const int nb = N - j0 < 128 ? N - j0 : 128;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, E, d, 1.0f, vrows + (size_t)j0 * d,
                                d, w, d, 0.0f, prod, E);
                }
            }
        }
    }
}

/* The dominant term of the leverage scorer: krows [N][d] (fp32) x phi
 * [d][k] into y [N][k] for every (layer, KV head). */
static void sketch_run(const kvs_layer *ly, int L, int k, float *krows, const float *phi, float *y) {
    for (int l = 0; l < L; l++) {
        const kvs_view *x = &ly[l].k;
        const int N = x->n_tokens, d = x->head_dim;
        for (int h = 0; h < x->n_heads; h++) {
            kvs_view_rows_f32(x, h, 0, N, krows);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, k, d, 1.0f, krows, d, phi, k, 0.0f, y, k);
        }
    }
}

/* ---- one cell ------------------------------------------------------------------ */

typedef struct {
    double med, p10, p90;
    double compress_med, apply_med; /* medians of the two parts (CPU) */
    double dom_med; /* NAN when not measured (GPU) */
    int dom_reps;
    int reps;
    double bytes, flops;
    int64_t bytes_before, bytes_after;
    char plan_note[256];
} oh_result;

static void summarise(double *t, int n, double *med, double *p10, double *p90) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    *med = quant(t, n, 0.5);
    *p10 = quant(t, n, 0.1);
    *p90 = quant(t, n, 0.9);
}

static kvs_status run_cpu(kvs_overhead *x, const kvs_experiment *e, const kvs_cell *c, int threads,
                          oh_result *r, kvs_err *err) {
    oh_inst *in = &x->in;
    const kvs_variant *var = &e->variants[c->variant];
    const kvs_method *m = var->method;
    const int L = in->L, S = in->n_sets, R = e->repeats, W = e->warmup;
    const int want = queries_wanted(var, in->N);
    kvs_status rc = KVS_OK;
    kvs_plan plan, last;
    memset(&plan, 0, sizeof plan);
    memset(&last, 0, sizeof last);
    kvs_dense_cache comp;
    memset(&comp, 0, sizeof comp);
    dct_bench db;
    memset(&db, 0, sizeof db);
    float *scratch = NULL, *wo = NULL;
    int sk = 0; /* sketch columns (DOM_SKETCH) */
    kvs_layer *work = calloc((size_t)S * L, sizeof *work); /* [S][L] */
    kvs_cache_view *cv = calloc((size_t)S, sizeof *cv);  /* [S] */
    double *t = malloc(sizeof *t * 3 * (size_t)R);       /* [3][R]: step, compress, apply */
    if (!work || !cv || !t) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int s = 0; s < S; s++) {
        make_work(in, &in->layers[(size_t)s * L], want, &work[(size_t)s * L]);
        cv[s] = (kvs_cache_view){L, &work[(size_t)s * L], in->modality[s]};
    }
    if (m->needs & KVS_NEED_W_O) { /* one synthetic [Hq][E = Hq d][d] projection for every layer */
        const int E = in->Hq * in->d;
        const size_t n = (size_t)in->Hq * E * in->d;
        if (!(wo = malloc(sizeof *wo * n))) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for the synthetic W_o (%zu floats)", n);
            goto cleanup;
        }
        uint64_t st = 0x5DEECE66Dull;
        const float amp = 1.0f / sqrtf((float)E);
        for (size_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            wo[i] = amp * ((float)(st >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
        }
        for (size_t i = 0; i < (size_t)S * L; i++)
            work[i].wo = (kvs_view){wo, KVS_F32, KVS_HOST, in->Hq, E, in->d, (int64_t)E * in->d, in->d};
    }
    kvs_budget b = {1.0, 0};
    if (c->budget >= 0) b = e->budgets[c->budget];

    /* the whole compression step */
    for (int it = 0; it < W + R; it++) {
        int s = it % S;
        double t0 = kvs_now_ms();
        if ((rc = kvs_compress(m, &var->params, &cv[s], &b, threads, &plan, err))) goto cleanup;
        double tm = kvs_now_ms();
        if ((rc = kvs_apply_into(&cv[s], &plan, threads, &comp, err))) goto cleanup;
        double t1 = kvs_now_ms();
        if (it >= W) {
            t[it - W] = t1 - t0;
            t[R + it - W] = tm - t0;
            t[2 * R + it - W] = t1 - tm;
        }
        if (it == W + R - 1) {
            r->bytes_after = 0;
            for (int l = 0; l < L; l++)
                r->bytes_after += 2 * (int64_t)comp.layers[l].n_kv_heads * comp.layers[l].n_tokens *
                                  comp.layers[l].head_dim * (int64_t)sizeof(float);
            snprintf(r->plan_note, sizeof r->plan_note, "%s", plan.note);
            last = plan;
            memset(&plan, 0, sizeof plan);
        } else {
            kvs_plan_free(&plan);
        }
    }
    double q1, q9;
    summarise(t, R, &r->med, &r->p10, &r->p90);
    summarise(t + R, R, &r->compress_med, &q1, &q9);
    summarise(t + 2 * R, R, &r->apply_med, &q1, &q9);
    r->reps = R;

    /* bytes and flops (models in the file comment) */
    const size_t es = kvs_dtype_size(in->dt);
    r->bytes_before = 2 * (int64_t)L * in->Hkv * in->N * in->d * (int64_t)es;
    r->bytes = (double)r->bytes_before + (double)L * in->Hq * want * in->d * (double)es +
               (double)r->bytes_after;
    double pairs = (double)want * (in->N - want) + (double)want * (want + 1) / 2.0;
    r->flops = dominant_kind(m) == DOM_ATTN ? 2.0 * in->d * in->Hq * pairs * L : 0.0;

    /* the dominant term: one warm-up, then min(R, max(5, R/2)) timed runs
     * (a micro-benchmark varies less than the whole step) */
    const int DR = R < 5 ? R : (R / 2 > 5 ? R / 2 : 5);
    r->dom_reps = DR;
    int dk = dominant_kind(m);
    if (dk == DOM_DCT) {
        if ((rc = dct_bench_init(&db, in, threads, err))) goto cleanup;
    } else if (dk == DOM_ATTN) {
        scratch = malloc(sizeof *scratch * (size_t)in->Hkv * in->N); /* [Hkv][N] colsum */
    } else if (dk == DOM_SKETCH) { /* krows [N][d], phi [d][k] (any values: the cost does not depend on them), y [N][k] */
        sk = (int)kvs_part_param(m, &var->params, "sketch_dimension", 48);
        scratch = calloc((size_t)in->N * in->d + (size_t)in->d * sk + (size_t)in->N * sk, sizeof *scratch);
    } else if (dk == DOM_WO) {
        scratch = malloc(sizeof *scratch * ((size_t)in->N * in->d + (size_t)128 * in->Hq * in->d)); /* vrows, prod */
    } else {
        int maxB = 1;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < in->Hkv; h++) /* the largest head (ragged plans) */
                maxB = last.layers[l].counts && last.layers[l].counts[h] > maxB ? last.layers[l].counts[h]
                       : last.layers[l].budget > maxB                            ? last.layers[l].budget
                                                                                 : maxB;
        /* [L][2][Hkv][maxB][d] gathered rows; DOM_NORM: + [L][Hkv][N] norms + [T][64][d] rows */
        const size_t nn = dk == DOM_NORM ? (size_t)L * in->Hkv * in->N + (size_t)64 * 64 * in->d : 0;
        scratch = malloc(sizeof *scratch * (2 * (size_t)L * in->Hkv * maxB * in->d + nn));
    }
    if (dk != DOM_DCT && !scratch) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for the dominant-term benchmark");
        goto cleanup;
    }
    int maxB = 1;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < in->Hkv; h++)
            maxB = last.layers[l].counts && last.layers[l].counts[h] > maxB ? last.layers[l].counts[h]
                   : last.layers[l].budget > maxB                            ? last.layers[l].budget
                                                                             : maxB;
    for (int it = 0; it < 1 + DR; it++) {
        int s = it % S;
        const kvs_layer *ly = &work[(size_t)s * L];
        double t0 = kvs_now_ms();
        if (dk == DOM_DCT) {
            if ((rc = dct_bench_run(&db, err))) goto cleanup;
        } else if (dk == DOM_SKETCH) {
            float *phi = scratch + (size_t)in->N * in->d;
            sketch_run(ly, L, sk, scratch, phi, phi + (size_t)in->d * sk);
        } else if (dk == DOM_WO) {
            wo_run(ly, L, scratch, scratch + (size_t)in->N * in->d);
        } else if (dk == DOM_ATTN) {
            for (int l = 0; l < L; l++)
                if ((rc = kvs_attn_colsum_fused(&ly[l].q, &ly[l].k, NULL, scratch, NULL, threads,
                                                err))) {
                    kvs_err_prefix(err, "dominant term: layer %d", l);
                    goto cleanup;
                }
        } else {
            float *nrm = scratch + 2 * (size_t)L * in->Hkv * maxB * in->d;
            if ((rc = gather_run(ly, L, &last, scratch, maxB, dk == DOM_NORM ? nrm : NULL,
                                 nrm + (size_t)L * in->Hkv * in->N, threads, err)))
                goto cleanup;
        }
        double t1 = kvs_now_ms();
        if (it >= 1) t[it - 1] = t1 - t0;
    }
    summarise(t, DR, &r->dom_med, &q1, &q9);
cleanup:
    dct_bench_free(&db);
    kvs_plan_free(&plan);
    kvs_plan_free(&last);
    kvs_dense_cache_free(&comp);
    free(scratch);
    free(wo);
    free(work);
    free(cv);
    free(t);
    return rc;
}

#ifdef KVSIEVE_HAVE_CUDA
static kvs_status cuda_fail(cudaError_t e, const char *what, kvs_err *err) {
    return kvs_errorf(err, KVS_ERR_INTERNAL, "CUDA %s: %s", what, cudaGetErrorString(e));
}

static void dev_free(kvs_overhead *x) {
    for (int s = 0; x->dbuf && s < x->dn_sets; s++) kvs_gpu_free(x->dbuf[s]);
    free(x->dbuf);
    free(x->dlayers);
    kvs_gpu_free(x->dk);
    kvs_gpu_free(x->dv);
    x->dbuf = NULL, x->dlayers = NULL, x->dk = x->dv = NULL, x->dn_sets = 0;
    x->dev_shape = x->dev_length = x->dev_dtype = -1;
}

/* Device copy bandwidth: one 1 GiB device-to-device copy, best of 5,
 * timed with events (bytes read + written). */
static kvs_status dev_copy_bandwidth(kvs_overhead *x, kvs_err *err) {
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kvs_status rc = KVS_OK;
    cudaStream_t st = (cudaStream_t)kvs_gpu_workspace_stream(x->ws);
    if ((rc = kvs_gpu_malloc(&a, bytes, err)) || (rc = kvs_gpu_malloc(&b, bytes, err))) goto cleanup;
    cudaError_t ce;
    if ((ce = cudaEventCreate(&e0)) || (ce = cudaEventCreate(&e1))) {
        rc = cuda_fail(ce, "event create", err);
        goto cleanup;
    }
    float best = 1e30f;
    for (int r = 0; r < 6; r++) {
        float ms = 0;
        if ((ce = cudaEventRecord(e0, st)) || (ce = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)) ||
            (ce = cudaEventRecord(e1, st)) || (ce = cudaEventSynchronize(e1)) ||
            (ce = cudaEventElapsedTime(&ms, e0, e1))) {
            rc = cuda_fail(ce, "device copy", err);
            goto cleanup;
        }
        if (r > 0 && ms < best) best = ms;
    }
    x->dev_copy_gbps = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    kvs_gpu_free(a);
    kvs_gpu_free(b);
    return rc;
}

static kvs_status run_cuda(kvs_overhead *x, const kvs_experiment *e, const kvs_cell *c,
                           oh_result *r, kvs_err *err) {
    oh_inst *in = &x->in;
    const kvs_variant *var = &e->variants[c->variant];
    const int L = in->L, S = in->n_sets, R = e->repeats, W = e->warmup, N = in->N;
    const int want = queries_wanted(var, N);
    kvs_status rc = KVS_OK;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_layer *work = calloc((size_t)S * L, sizeof *work); /* [S][L] device views */
    double *t = malloc(sizeof *t * (size_t)R);
    if (!work || !t) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    kvs_shape need = {L, N, in->Hkv, in->Hq, in->d, in->nq, 1};
    if (x->ws && memcmp(&need, &x->ws_shape, sizeof need) != 0) {
        dev_free(x);
        kvs_gpu_workspace_free(x->ws);
        x->ws = NULL;
    }
    if (!x->ws) {
        if ((rc = kvs_gpu_workspace_init(&x->ws, &need, err))) goto cleanup;
        x->ws_shape = need;
        snprintf(x->dev_name, sizeof x->dev_name, "%s", kvs_gpu_workspace_device(x->ws));
        if (x->dev_copy_gbps <= 0 && (rc = dev_copy_bandwidth(x, err))) goto cleanup;
        logf_line(x, "device: %s, copy bandwidth %.0f GB/s (device-to-device, read + write)\n",
                  x->dev_name, x->dev_copy_gbps);
    }
    if (x->dev_shape != c->shape || x->dev_length != c->length || x->dev_dtype != c->dtype) {
        dev_free(x);
        const size_t es = kvs_dtype_size(in->dt);
        const size_t per_layer = 2 * (size_t)in->Hkv * N * in->d + (size_t)in->Hq * in->nq * in->d;
        x->dbuf = calloc((size_t)S, sizeof *x->dbuf);
        x->dlayers = calloc((size_t)S * L, sizeof *x->dlayers);
        if (!x->dbuf || !x->dlayers) {
            rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        x->dn_sets = S;
        for (int s = 0; s < S; s++) {
            if ((rc = kvs_gpu_malloc(&x->dbuf[s], per_layer * L * es, err)) ||
                (rc = kvs_gpu_memcpy_h2d(x->dbuf[s], in->buf[s], per_layer * L * es, err)))
                goto cleanup;
            for (int l = 0; l < L; l++) {
                kvs_layer ly = in->layers[(size_t)s * L + l];
                ptrdiff_t off = (const char *)ly.k.data - (const char *)in->buf[s];
                ly.k.data = (const char *)x->dbuf[s] + off;
                ly.k.device = KVS_CUDA;
                off = (const char *)ly.v.data - (const char *)in->buf[s];
                ly.v.data = (const char *)x->dbuf[s] + off;
                ly.v.device = KVS_CUDA;
                if (ly.q.data) {
                    off = (const char *)ly.q.data - (const char *)in->buf[s];
                    ly.q.data = (const char *)x->dbuf[s] + off;
                    ly.q.device = KVS_CUDA;
                }
                x->dlayers[(size_t)s * L + l] = ly;
            }
        }
        size_t outb = sizeof(float) * (size_t)in->Hkv * N * in->d;
        if ((rc = kvs_gpu_malloc((void **)&x->dk, outb, err)) ||
            (rc = kvs_gpu_malloc((void **)&x->dv, outb, err)))
            goto cleanup;
        x->dev_shape = c->shape, x->dev_length = c->length, x->dev_dtype = c->dtype;
    }
    cudaStream_t st = (cudaStream_t)kvs_gpu_workspace_stream(x->ws);
    cudaError_t ce;
    if ((ce = cudaEventCreate(&e0)) || (ce = cudaEventCreate(&e1))) {
        rc = cuda_fail(ce, "event create", err);
        goto cleanup;
    }
    kvs_budget b = {1.0, 0};
    if (c->budget >= 0) b = e->budgets[c->budget];
    for (int it = 0; it < W + R; it++) {
        int s = it % S;
        make_work(in, &x->dlayers[(size_t)s * L], want, &work[(size_t)s * L]);
        kvs_cache_view cv = {L, &work[(size_t)s * L], in->modality[s]};
        if ((ce = cudaEventRecord(e0, st))) {
            rc = cuda_fail(ce, "event record", err);
            goto cleanup;
        }
        if ((rc = kvs_gpu_compress(var->method->name, &var->params, &cv, &b, x->ws, &plan, err)))
            goto cleanup;
        for (int l = 0; l < L; l++)
            if ((rc = kvs_gpu_apply_layer(x->ws, &cv.layers[l], &plan, l, x->dk, x->dv, err)))
                goto cleanup;
        float ms = 0;
        if ((ce = cudaEventRecord(e1, st)) || (ce = cudaEventSynchronize(e1)) ||
            (ce = cudaEventElapsedTime(&ms, e0, e1))) {
            rc = cuda_fail(ce, "event timing", err);
            goto cleanup;
        }
        if ((rc = kvs_gpu_sync(x->ws, err))) goto cleanup;
        if (it >= W) t[it - W] = ms;
        if (it == W + R - 1) {
            r->bytes_after = 0;
            for (int l = 0; l < L; l++)
                r->bytes_after += 2 * (int64_t)in->Hkv * plan.layers[l].budget * in->d *
                                  (int64_t)sizeof(float);
            snprintf(r->plan_note, sizeof r->plan_note, "%s", plan.note);
        }
        kvs_plan_free(&plan);
    }
    summarise(t, R, &r->med, &r->p10, &r->p90);
    r->reps = R;
    const size_t es = kvs_dtype_size(in->dt);
    r->bytes_before = 2 * (int64_t)L * in->Hkv * N * in->d * (int64_t)es;
    r->bytes = (double)r->bytes_before + (double)L * in->Hq * want * in->d * (double)es +
               (double)r->bytes_after;
    double pairs = (double)want * (N - want) + (double)want * (want + 1) / 2.0;
    r->flops = dominant_kind(var->method) == DOM_ATTN ? 2.0 * in->d * in->Hq * pairs * L : 0.0;
    r->dom_med = NAN;
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    kvs_plan_free(&plan);
    free(work);
    free(t);
    return rc;
}
#endif

/* ---- entry points ------------------------------------------------------------------ */

/* The token limit of (method, shape) in an overhead experiment: a limit
 * for the shape wins over one for every shape; -1 = none, 0 = the method
 * does not run at this shape. */
int kvs_overhead_limit(const kvs_experiment *e, const char *method, const char *shape) {
    int any = -1, specific = -1;
    for (int i = 0; i < e->n_limits; i++) {
        if (strcmp(e->limits[i].method, method) != 0) continue;
        if (!e->limits[i].shape[0])
            any = e->limits[i].max_tokens;
        else if (!strcmp(e->limits[i].shape, shape))
            specific = e->limits[i].max_tokens;
    }
    return specific >= 0 ? specific : any;
}

void kvs_overhead_label(const kvs_experiment *e, const kvs_cell *c, const char *budget, char *out,
                        size_t n) {
    int thr = e->n_thread_counts > 0 ? e->thread_counts[c->threads] : e->threads;
    snprintf(out, n, "%s N=%d %s %s %dt  %s  budget %s", e->shapes[c->shape].name,
             e->lengths[c->length], kvs_dtype_name(e->n_dtypes > 0 ? e->dtypes[c->dtype] : e->dtype),
             e->n_devices > 0 ? e->devices[c->device] : e->device, thr,
             e->variants[c->variant].label, budget);
}

kvs_status kvs_overhead_begin(const kvs_experiment *e, FILE *log, int tty, kvs_overhead **out,
                              kvs_err *err) {
    (void)e;
    *out = NULL;
    kvs_overhead *x = calloc(1, sizeof *x);
    if (!x) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    x->log = log;
    x->tty = tty;
    x->in.shape = x->in.length = x->in.dtype = -1;
#ifdef KVSIEVE_HAVE_CUDA
    x->dev_shape = x->dev_length = x->dev_dtype = -1;
#endif
    cpu_model(x->cpu_model, sizeof x->cpu_model);
    kvs_status rc = host_copy_bandwidth(&x->copy_gbps, err);
    if (rc) {
        free(x);
        return rc;
    }
    logf_line(x, "host: %s, %ld CPUs online, build %s; memcpy bandwidth %.1f GB/s (256 MiB, "
                 "1 thread, read + write)\n",
              x->cpu_model, sysconf(_SC_NPROCESSORS_ONLN), KVS_BUILD_TYPE, x->copy_gbps);
    *out = x;
    return KVS_OK;
}

kvs_status kvs_overhead_cell(kvs_overhead *x, const kvs_experiment *e, const kvs_cell *c,
                             kvs_store *s, int64_t run_id, kvs_err *err) {
    kvs_status rc;
    const kvs_variant *var = &e->variants[c->variant];
    const char *device = e->n_devices > 0 ? e->devices[c->device] : e->device;
    const int threads = e->n_thread_counts > 0 ? e->thread_counts[c->threads] : e->threads;
    const int is_cuda = !strcmp(device, "cuda");
    if (is_cuda) {
        /* never a CPU run labelled cuda: no device is an error */
        int count = 0;
        if ((rc = kvs_gpu_device_count(&count, err)))
            return kvs_err_prefix(err, "device \"cuda\"");
        if (count < 1)
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "device \"cuda\": no CUDA device found");
    }
    if ((rc = inst_load(x, e, c, err))) return rc;
    oh_result r;
    memset(&r, 0, sizeof r);
    r.dom_med = NAN;
    if (is_cuda) {
#ifdef KVSIEVE_HAVE_CUDA
        if ((rc = run_cuda(x, e, c, &r, err))) return rc;
#else
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED, "device \"cuda\": built without CUDA");
#endif
    } else if ((rc = run_cpu(x, e, c, threads, &r, err))) {
        return rc;
    }

    /* rows */
    const kvs_eval_shape *sh = &e->shapes[c->shape];
    const double copy = is_cuda ?
#ifdef KVSIEVE_HAVE_CUDA
                                x->dev_copy_gbps
#else
                                0.0
#endif
                                : x->copy_gbps;
    double gbps = r.bytes / (r.med * 1e-3) / 1e9;
    double gflops = r.flops > 0 ? r.flops / (r.med * 1e-3) / 1e9 : NAN;
    int dk = dominant_kind(var->method);
    char devcol[32];
    if (is_cuda)
        snprintf(devcol, sizeof devcol, "cuda");
    else
    {
        char full[256]; /* the report keeps 31 characters: threads and build first */
        snprintf(full, sizeof full, "cpu %dt %s %s", threads, KVS_BUILD_TYPE, x->cpu_model);
        size_t len = strlen(full);
        if (len > sizeof devcol - 1) len = sizeof devcol - 1;
        while (len > 0 && full[len - 1] == ' ') len--;
        memcpy(devcol, full, len);
        devcol[len] = '\0';
    }
    char note[1024];
    int k = snprintf(note, sizeof note,
                     "device=%s; host=%s; build=%s; threads=%d; input_sets=%d; repetitions=%d; "
                     "warmup=%d; bytes_moved=%.0f (K+V read once in %s, queries read %d, "
                     "compacted K+V written fp32); gbps=%.3f; copy_gbps=%.3f",
                     is_cuda ?
#ifdef KVSIEVE_HAVE_CUDA
                             x->dev_name
#else
                             "cuda"
#endif
                             : "cpu",
                     x->cpu_model, KVS_BUILD_TYPE, is_cuda ? 0 : threads, x->in.n_sets, r.reps,
                     e->warmup, r.bytes, kvs_dtype_name(x->in.dt), queries_wanted(var, x->in.N),
                     gbps, copy);
    if (k > 0 && (size_t)k < sizeof note && r.flops > 0)
        k += snprintf(note + k, sizeof note - (size_t)k, "; gflops=%.3f", gflops);
    if (k > 0 && (size_t)k < sizeof note && r.flops > 0 && !isnan(r.dom_med))
        k += snprintf(note + k, sizeof note - (size_t)k, "; pass_gflops=%.3f",
                      r.flops / (r.dom_med * 1e-3) / 1e9);
    if (k > 0 && (size_t)k < sizeof note && !isnan(r.dom_med))
        k += snprintf(note + k, sizeof note - (size_t)k,
                      "; compress_ms=%.6g; apply_ms=%.6g; dominant=%s; dominant_ms=%.6g; "
                      "dominant_reps=%d; ratio=%.4f",
                      r.compress_med, r.apply_med, dom_names[dk], r.dom_med, r.dom_reps,
                      r.med / r.dom_med);
    if (k > 0 && (size_t)k < sizeof note && r.plan_note[0])
        snprintf(note + k, sizeof note - (size_t)k, "; plan: %s", r.plan_note);

    kvs_latency_row lr = {0};
    lr.cell_key = c->key;
    lr.method = var->method->name;
    lr.params_json = var->params_json;
    lr.device = devcol;
    lr.shape = sh->name;
    lr.dtype = kvs_dtype_name(x->in.dt);
    lr.n_tokens = x->in.N;
    lr.repetitions = r.reps;
    lr.median_ms = r.med;
    lr.p10_ms = r.p10;
    lr.p90_ms = r.p90;
    lr.bytes_moved = r.bytes;
    lr.gbps = gbps;
    if ((rc = kvs_store_put_latency(s, run_id, &lr, 1, err))) return rc;

    char sample[300] = "input_sets=", dsver[64];
    for (int i = 0; i < x->in.n_sets; i++) {
        size_t l = strlen(sample);
        snprintf(sample + l, sizeof sample - l, "%s%lld", i ? "," : "", (long long)e->seeds[i]);
    }
    snprintf(dsver, sizeof dsver, "kvs_synth_generate v%s", KVS_SYNTH_VERSION);
    kvs_cell_row row = {0};
    row.key = c->key;
    row.experiment = e->name;
    row.kind = "overhead";
    row.definition = c->def;
    row.dataset = "synthetic";
    row.dataset_version = dsver;
    row.sample_id = sample;
    row.shape = sh->name;
    row.n_tokens = x->in.N;
    row.seed = e->seeds[0];
    row.method = var->method->name;
    row.label = var->label;
    row.params_json = var->params_json;
    if (c->budget < 0) {
        row.budget_ratio = 1.0;
    } else {
        row.budget_ratio = e->budgets[c->budget].ratio;
        row.budget_tokens = e->budgets[c->budget].tokens;
    }
    kvs_result_row res = {0};
    res.compress_ms = r.med;
    res.kv_bytes_before = r.bytes_before;
    res.kv_bytes_after = r.bytes_after;
    res.note = note;
    if ((rc = kvs_store_put(s, run_id, &row, &res, 1, err))) return rc;

    char lab[400], bud[32];
    if (c->budget < 0)
        snprintf(bud, sizeof bud, "all");
    else if (e->budgets[c->budget].tokens > 0)
        snprintf(bud, sizeof bud, "%lld tok", (long long)e->budgets[c->budget].tokens);
    else
        snprintf(bud, sizeof bud, "%g", e->budgets[c->budget].ratio);
    kvs_overhead_label(e, c, bud, lab, sizeof lab);
    char dom[256] = "";
    if (!isnan(r.dom_med))
        snprintf(dom, sizeof dom, " (compress %.3f + apply %.3f); %s %.3f ms, ratio %.2f",
                 r.compress_med, r.apply_med, dom_names[dk], r.dom_med, r.med / r.dom_med);
    char fl[48] = "";
    if (r.flops > 0) snprintf(fl, sizeof fl, ", %.1f GFLOP/s", gflops);
    logf_line(x, "%s: %.3f ms [p10 %.3f, p90 %.3f], %.2f GB/s of %.1f%s%s\n", lab, r.med, r.p10,
              r.p90, gbps, copy, fl, dom);
    if (x->n_done == x->cap_done) {
        int cap = x->cap_done ? 2 * x->cap_done : 64;
        oh_done *nd = realloc(x->done, sizeof *nd * (size_t)cap);
        if (nd) x->done = nd, x->cap_done = cap;
    }
    if (x->n_done < x->cap_done) {
        oh_done *d = &x->done[x->n_done++];
        snprintf(d->label, sizeof d->label, "%s", lab);
        d->med = r.med, d->dom = r.dom_med, d->gbps = gbps, d->gflops = gflops;
    }
    return KVS_OK;
}

void kvs_overhead_end(kvs_overhead *x) {
    if (!x) return;
    if (x->log && x->n_done > 0) {
        int over = 0, measured = 0;
        for (int i = 0; i < x->n_done; i++)
            if (!isnan(x->done[i].dom)) {
                measured++;
                over += x->done[i].med > 2.0 * x->done[i].dom;
            }
        if (measured > 0) {
            logf_line(x, "CPU bar (median <= 2 x dominant term): %d of %d cells within it\n",
                      measured - over, measured);
            for (int i = 0; i < x->n_done; i++)
                if (!isnan(x->done[i].dom) && x->done[i].med > 2.0 * x->done[i].dom)
                    logf_line(x, "  over the bar: %s: %.3f ms vs %.3f ms (ratio %.2f)\n",
                              x->done[i].label, x->done[i].med, x->done[i].dom,
                              x->done[i].med / x->done[i].dom);
        }
    }
#ifdef KVSIEVE_HAVE_CUDA
    dev_free(x);
    kvs_gpu_workspace_free(x->ws);
#endif
    inst_free(&x->in);
    free(x->done);
    free(x);
}
