/* test_eval_overhead.c -- kind `overhead` (eval/overhead.c) end to end on the
 * tiny shape: every cell stores a latency row and a result with sane fields
 * (p10 <= median <= p90, repetitions, bytes moved by the stated model,
 * hand-checked for three cells, GB/s, the dominant term and its ratio;
 * key-only scorers against the key-norm pass);
 * resume skips finished cells; --threads defines new cells; max_tokens
 * limits the grid; a cuda cell without a device fails with a clear message
 * and stores nothing (with a device it is timed and stored as "cuda"); a
 * cache too large for the machine's memory is a clear error, not a crash;
 * config errors for the overhead fields name file:line and the field.
 * Never asserts on wall-clock values beyond their order. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "kvs_kernels.h"
#include "test_util.h"

#include <sqlite3.h>

static char dir[64];

static const char *CFG =
    "-- tiny overhead grid\n"
    "experiment {\n"
    "  name = \"oh\", kind = \"overhead\",\n"
    "  dataset = synthetic { shape = \"tiny\", n_tokens = { 64, 128 } },\n"
    "  methods = { \"full\", \"random\", \"streamingllm\", \"h2o\", \"snapkv\", \"lookm\", \"meda\", "
    "\"flashcache\" },\n"
    "  params = { snapkv = { window = 8 } },\n"
    "  budgets = 0.25,\n"
    "  dtype = { \"f32\", \"f16\" },\n"
    "  threads = 1,\n"
    "  repeats = 3, warmup = 1,\n"
    "}\n";
enum { CFG_CELLS = 2 * 2 * 8 }; /* N x dtype x methods */

static long long q1(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    else
        fprintf(stderr, "query failed: %s: %s\n", sql, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return v;
}

static double qd(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    double v = NAN;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    return v;
}

static kvs_status run_text(const char *name, const char *text, const char *db, int threads,
                           kvs_run_summary *sum, kvs_err *err) {
    char path[256];
    kvs_config cfg;
    kvs_store *s = NULL;
    eval_write(dir, name, text, path, sizeof path);
    kvs_status rc = kvs_config_load(path, NULL, 0, &cfg, err);
    if (rc) return rc;
    if ((rc = kvs_store_open(db, &s, err))) {
        kvs_config_free(&cfg);
        return rc;
    }
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    o.threads_override = threads;
    rc = kvs_run_config(s, &cfg, &o, sum, err);
    kvs_store_close(s);
    kvs_config_free(&cfg);
    return rc;
}

static void test_run_and_resume(void) {
    char db[256];
    kvs_err err = {0};
    kvs_run_summary sum;
    snprintf(db, sizeof db, "%s/oh.db", dir);
    CHECK_OK(run_text("oh.lua", CFG, db, 0, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, CFG_CELLS);
    CHECK_EQ_INT(sum.n_done, CFG_CELLS);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency"), CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(DISTINCT cell_key) FROM latency"), CFG_CELLS);
    /* every latency row belongs to a finished cell of this experiment */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency l JOIN cells c ON c.key = l.cell_key "
                       "JOIN results r ON r.cell_key = l.cell_key WHERE c.kind = 'overhead' "
                       "AND c.experiment = 'oh'"),
                 CFG_CELLS);
    /* sane fields */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE NOT (p10_ms <= median_ms AND "
                       "median_ms <= p90_ms AND p10_ms > 0)"),
                 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE repetitions <> 3"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE NOT (bytes_moved > 0 AND gbps > 0)"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE device NOT LIKE 'cpu 1t %'"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE length(device) > 31"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE dtype = 'F32'"), CFG_CELLS / 2);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE dtype = 'F16'"), CFG_CELLS / 2);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE shape <> 'tiny' OR n_tokens NOT IN "
                       "(64, 128)"),
                 0);
    /* the result row carries the median and what the latency table has no
     * column for */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency l JOIN results r ON r.cell_key = l.cell_key "
                       "WHERE r.compress_ms <> l.median_ms"),
                 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results WHERE note LIKE '%threads=1;%' AND note LIKE "
                       "'%input_sets=3;%' AND note LIKE '%dominant_ms=%' AND note LIKE "
                       "'%ratio=%' AND note LIKE '%copy_gbps=%' AND note LIKE '%build=%'"),
                 CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                       "c.method IN ('h2o','lookm','meda','snapkv') AND r.note LIKE "
                       "'%dominant=attention pass%' AND r.note LIKE '%gflops=%'"),
                 16);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                       "c.method = 'flashcache' AND r.note LIKE '%dominant=DCT-II+III pair%'"),
                 4);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                       "c.method IN ('full','random','streamingllm') AND r.note LIKE "
                       "'%dominant=cache read + gather%'"),
                 12);
    /* bytes moved, hand-checked (tiny: L 2, Hq 4, Hkv 2, d 16):
     *   full, N 64, F32:  K+V read 2*2*2*64*16*4 = 32768, written fp32 32768
     *   full, N 64, F16:  read 16384, written 32768
     *   h2o, N 64, F32:   read 32768 + Q 2*4*64*16*4 = 32768, written
     *                     2*2*2*16*16*4 = 8192 (B = floor(0.25 * 64) = 16) */
    CHECK_NEAR(qd(h, "SELECT bytes_moved FROM latency WHERE method='full' AND n_tokens=64 AND "
                     "dtype='F32'"),
               65536, 0);
    CHECK_NEAR(qd(h, "SELECT bytes_moved FROM latency WHERE method='full' AND n_tokens=64 AND "
                     "dtype='F16'"),
               49152, 0);
    CHECK_NEAR(qd(h, "SELECT bytes_moved FROM latency WHERE method='h2o' AND n_tokens=64 AND "
                     "dtype='F32'"),
               73728, 0);
    CHECK_NEAR(qd(h, "SELECT kv_bytes_before FROM results r JOIN cells c ON c.key = r.cell_key "
                     "WHERE c.method='full' AND c.n_tokens=128 AND c.definition LIKE "
                     "'%dtype=F16%'"),
               2 * 2 * 2 * 128 * 16 * 2, 0);
    /* gbps is bytes / median */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE abs(gbps - bytes_moved / (median_ms * "
                       "1e-3) / 1e9) > 1e-9 * gbps"),
                 0);
    long long runs = q1(h, "SELECT count(*) FROM runs WHERE kind = 'overhead' AND status = 'done'");
    CHECK_EQ_INT(runs, 1);
    sqlite3_close(h);

    /* resume: nothing new */
    CHECK_OK(run_text("oh.lua", CFG, db, 0, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 0);
    CHECK_EQ_INT(sum.n_already, CFG_CELLS);
    /* another thread count defines other cells (it changes the timing) */
    const char *one =
        "experiment { name = \"oh\", kind = \"overhead\", repeats = 3, warmup = 0,\n"
        "  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
        "  methods = { \"streamingllm\" }, budgets = 0.25, threads = 1 }\n";
    CHECK_OK(run_text("one.lua", one, db, 0, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 1);
    CHECK_OK(run_text("one.lua", one, db, 2, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 1);
    CHECK_OK(run_text("one.lua", one, db, 2, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 0);
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency"), CFG_CELLS + 2);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE device LIKE 'cpu 2t %'"), 1);
    sqlite3_close(h);

    /* the report prints the latency table for the experiment */
    kvs_store *s = NULL;
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (s) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        kvs_report_opts ro;
        memset(&ro, 0, sizeof ro);
        ro.experiment = "oh";
        CHECK_OK(kvs_report_write(s, &ro, f, &err), &err);
        fclose(f);
        CHECK(buf && strstr(buf, "### latency: tiny, cpu 1t ") != NULL);
        CHECK(buf && strstr(buf, "| N | full | random | streamingllm | h2o | snapkv window=8 |") !=
                         NULL);
        CHECK(buf && strstr(buf, "| 128 |") != NULL);
        free(buf);
        kvs_store_close(s);
    }
}

/* Presets whose scorer reads only K and V are measured against one pass of
 * key norms + the V read and the gather (DOM_NORM). */
static void test_key_scorers(void) {
    char db[256];
    kvs_err err = {0};
    kvs_run_summary sum;
    snprintf(db, sizeof db, "%s/keys.db", dir);
    const char *t =
        "experiment { name = \"keys\", kind = \"overhead\", repeats = 3, warmup = 0,\n"
        "  dataset = synthetic { shape = \"tiny\", n_tokens = 64 }, dtype = \"f16\",\n"
        "  methods = { \"knorm\", \"keydiff\", \"lagkv\", \"cur\", \"full\" }, budgets = 0.25,\n"
        "  threads = 2 }\n";
    CHECK_OK(run_text("keys.lua", t, db, 0, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 5);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                       "c.method IN ('knorm','keydiff','lagkv','cur') AND r.note LIKE "
                       "'%dominant=key norms + gather; dominant_ms=%' AND r.note LIKE '%ratio=%'"),
                 4);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                       "c.method = 'full' AND r.note LIKE '%dominant=cache read + gather;%'"),
                 1);
    sqlite3_close(h);
}

static void test_limits_and_seeds(void) {
    char path[256];
    kvs_err err = {0};
    kvs_config cfg;
    const char *t =
        "experiment {\n"
        "  name = \"lim\", kind = \"overhead\",\n"
        "  dataset = synthetic { shape = { \"tiny\", \"gemma3-270m\" }, n_tokens = { 64, 128, 256 } },\n"
        "  methods = { \"full\", \"h2o\", \"flashcache\" },\n"
        "  budgets = 0.25, threads = { 1, 2 },\n"
        /* snapkv is not run: its limit is accepted (-D methods= may narrow a grid) */
        "  max_tokens = { h2o = { tiny = 128, [\"gemma3-270m\"] = 0 }, flashcache = 64, snapkv = 32 },\n"
        "}\n";
    eval_write(dir, "lim.lua", t, path, sizeof path);
    CHECK_OK(kvs_config_load(path, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    const kvs_experiment *e = &cfg.experiments[0];
    CHECK_EQ_INT(e->n_seeds, 3); /* three rotated input sets by default */
    CHECK_EQ_INT(e->n_thread_counts, 2);
    CHECK_EQ_INT(e->n_dtypes, 1);
    CHECK_EQ_INT(e->dtypes[0], KVS_F32);
    kvs_cell *cells = NULL;
    int n = 0;
    CHECK_OK(kvs_grid_expand(e, &cells, &n, &err), &err);
    /* per thread count: full 2 shapes x 3 N = 6; h2o tiny 64, 128 = 2;
     * flashcache N 64 at both shapes = 2 */
    CHECK_EQ_INT(n, 2 * (6 + 2 + 2));
    int h2o = 0;
    for (int i = 0; i < n; i++) {
        const char *m = e->variants[cells[i].variant].method->name;
        int N = e->lengths[cells[i].length];
        if (!strcmp(m, "h2o")) {
            h2o++;
            CHECK(N <= 128 && !strcmp(e->shapes[cells[i].shape].name, "tiny"));
        }
        if (!strcmp(m, "flashcache")) CHECK(N == 64);
        for (int j = 0; j < i; j++) CHECK(strcmp(cells[i].key, cells[j].key) != 0);
    }
    CHECK_EQ_INT(h2o, 4);
    free(cells);
    kvs_config_free(&cfg);
}

static void test_cuda_cell(void) {
    char db[256];
    kvs_err err = {0};
    kvs_run_summary sum;
    snprintf(db, sizeof db, "%s/cuda.db", dir);
    const char *t =
        "experiment { name = \"gpu\", kind = \"overhead\", device = \"cuda\", dtype = \"f16\",\n"
        "  repeats = 3, warmup = 1,\n"
        "  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
        "  methods = { \"flashcache\" }, budgets = 0.25 }\n";
    int count = 0;
    kvs_err e2 = {0};
    kvs_status have = kvs_gpu_device_count(&count, &e2);
    if (have == KVS_OK && count > 0) {
        printf("a CUDA device is present: timing the cuda cell\n");
        CHECK_OK(run_text("gpu.lua", t, db, 0, &sum, &err), &err);
        sqlite3 *h = NULL;
        CHECK(sqlite3_open(db, &h) == SQLITE_OK);
        CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE device = 'cuda' AND repetitions = 3 "
                           "AND p10_ms <= median_ms AND median_ms <= p90_ms"),
                     1);
        sqlite3_close(h);
        return;
    }
    printf("no CUDA device (%s): checking the error\n", e2.msg);
    kvs_err_clear(&err);
    kvs_status rc = run_text("gpu.lua", t, db, 0, &sum, &err);
    CHECK_EQ_INT(rc, KVS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "device \"cuda\"") != NULL, "%s", err.msg);
    CHECK_MSG(strstr(err.msg, "no CUDA device") != NULL || strstr(err.msg, "built without CUDA"),
              "%s", err.msg);
    CHECK_MSG(strstr(err.msg, "experiment 'gpu'") != NULL, "%s", err.msg);
    CHECK_EQ_INT(sum.n_failed, 1);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status = 'failed' AND error LIKE "
                       "'%cuda%'"),
                 1);
    sqlite3_close(h);
}

/* A shape whose one input set cannot fit: a clear error before any
 * allocation, naming the sizes. */
static void test_too_big(void) {
    char db[256];
    kvs_err err = {0};
    kvs_run_summary sum;
    snprintf(db, sizeof db, "%s/big.db", dir);
    const char *t =
        "experiment { name = \"big\", kind = \"overhead\", repeats = 1, warmup = 0,\n"
        "  dataset = synthetic { shape = shape { layers = 256, q_heads = 256, kv_heads = 256,\n"
        "    head_dim = 1024 }, n_tokens = 1048576 },\n"
        "  methods = { \"streamingllm\" }, budgets = 0.25 }\n";
    CHECK_FAILS(run_text("big.lua", t, db, 0, &sum, &err), KVS_ERR_NOMEM, &err,
                "custom-L256-Hq256-Hkv256-d1024 N=1048576 F32: one input set needs");
    CHECK(strstr(err.msg, "GB of memory are available") != NULL);
}

static void bad(const char *name, const char *fields, const char *needle) {
    char text[1024], path[256];
    snprintf(text, sizeof text,
             "experiment {\n"
             "  name = \"bad\", kind = \"overhead\",\n"
             "  dataset = synthetic { shape = \"tiny\", n_tokens = { 64, 128 } },\n"
             "  methods = { \"full\", \"flashcache\" },\n"
             "  budgets = 0.25,\n"
             "%s\n"
             "}\n",
             fields);
    eval_write(dir, name, text, path, sizeof path);
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_FAILS(kvs_config_load(path, NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err, needle);
}

static void test_config_errors(void) {
    /* the overhead field sits on line 6 of every file below */
    bad("b1.lua", "  dtype = \"f8\",", "b1.lua:6: dtype: 'f8' is not one of: f32, f16, bf16");
    bad("b2.lua", "  device = { \"cpu\", \"cpu\" },", "b2.lua:6: device[2]: 'cpu' given twice");
    bad("b3.lua", "  device = \"tpu\",", "b3.lua:6: device: 'tpu' is not one of: cpu, cuda");
    bad("b4.lua", "  threads = { 1, 0 },", "b4.lua:6: threads[2]: 0 out of range [1, 256]");
    bad("b5.lua", "  threads = { 2, 2 },", "b5.lua:6: threads[2]: 2 given twice");
    bad("b7.lua", "  max_tokens = { flashcache = { nope = 64 } },",
        "b7.lua:6: max_tokens.flashcache.nope: shape 'nope' is neither");
    bad("b8.lua", "  max_tokens = { flashcache = -1 },",
        "b8.lua:6: max_tokens.flashcache: expected a whole number of tokens in [0, 1048576]");
    bad("b9.lua", "  max_tokens = 4096,", "b9.lua:6: max_tokens: expected a table");
    bad("b10.lua", "  warmup = -1,", "b10.lua:6: warmup: -1 out of range [0, 1000]");
    bad("b11.lua", "  max_tokens = { nosuch = 64 },",
        "b11.lua:6: max_tokens.nosuch: unknown method 'nosuch'");
    /* overhead fields in another kind */
    char path[256];
    const char *fid =
        "experiment {\n  name = \"f\",\n  dataset = synthetic { shape = \"tiny\", n_tokens = 64 },\n"
        "  methods = { \"full\" },\n  budgets = 0.2,\n  max_tokens = { full = 64 },\n}\n";
    eval_write(dir, "fid.lua", fid, path, sizeof path);
    kvs_config cfg;
    kvs_err err = {0};
    CHECK_FAILS(kvs_config_load(path, NULL, 0, &cfg, &err), KVS_ERR_INVALID, &err,
                "fid.lua:6: max_tokens: not used by kind 'fidelity'");
}

int main(void) {
    if (eval_tmpdir(dir, "overhead")) return 1;
    double t0 = kvs_now_ms();
    test_run_and_resume();
    double t1 = kvs_now_ms();
    test_key_scorers();
    test_limits_and_seeds();
    test_cuda_cell();
    test_too_big();
    test_config_errors();
    printf("run + resume %.0f ms, the rest %.0f ms\n", t1 - t0, kvs_now_ms() - t1);
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_overhead");
}
