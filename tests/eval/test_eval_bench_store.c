/* test_eval_bench_store.c -- the engine_bench table of `kvsieve bench`:
 * migration from schema version 2 (its SQL is written out here, as it
 * shipped) keeps the old data and adds the table; a row written with a
 * runs row of kind "bench" reads back column for column (an unknown
 * percentile or load average is NULL, the host CPU is filled in); bad rows
 * and a missing run are refused with messages naming the field and the
 * database; `kvsieve report` shows the engine throughput table in every
 * format (newest row per key, filters by experiment and run) and works on a
 * database that holds only bench rows. Values are fixed numbers, never
 * measured times. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <math.h>
#include <sqlite3.h>

static char dir[64];

#define CHECK_STR_EQ(a, b)                                                                    \
    CHECK_MSG((a) && !strcmp((const char *)(a), (b)), "got '%s', want '%s'",                  \
              (a) ? (const char *)(a) : "(null)", (b))

/* Schema version 2, verbatim (version 1 plus the 1 -> 2 migration), with a
 * run, a cell, its result and a latency row. */
static const char *V2 =
    "CREATE TABLE schema_version(version INTEGER NOT NULL);"
    "CREATE TABLE runs(id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, config_path TEXT,"
    " config_text TEXT NOT NULL, config_hash TEXT NOT NULL, git_rev TEXT, host TEXT,"
    " kvsieve_version TEXT, started_at TEXT NOT NULL, ended_at TEXT, status TEXT NOT NULL);"
    "CREATE TABLE cells(key TEXT PRIMARY KEY, experiment TEXT NOT NULL, kind TEXT NOT NULL,"
    " definition TEXT NOT NULL, model TEXT, model_hash TEXT, dataset TEXT NOT NULL,"
    " dataset_version TEXT, sample_id TEXT NOT NULL, shape TEXT, n_tokens INTEGER, seed INTEGER,"
    " method TEXT NOT NULL, label TEXT NOT NULL, params TEXT NOT NULL, budget_ratio REAL,"
    " budget_tokens INTEGER, prompt_hash TEXT);"
    "CREATE TABLE results(cell_key TEXT PRIMARY KEY REFERENCES cells(key),"
    " run_id INTEGER REFERENCES runs(id), prediction TEXT, prefill_ms REAL, compress_ms REAL,"
    " decode_ms REAL, decode_tokens INTEGER, kv_bytes_before INTEGER, kv_bytes_after INTEGER,"
    " note TEXT, finished_at TEXT NOT NULL);"
    "CREATE TABLE scores(cell_key TEXT NOT NULL REFERENCES results(cell_key), metric TEXT NOT NULL,"
    " value REAL, PRIMARY KEY(cell_key, metric)) WITHOUT ROWID;"
    "CREATE INDEX cells_experiment ON cells(experiment);"
    "CREATE INDEX results_run ON results(run_id);"
    "INSERT INTO schema_version VALUES(1);"
    "ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'fidelity';"
    "ALTER TABLE runs ADD COLUMN overrides TEXT;"
    "ALTER TABLE runs ADD COLUMN device TEXT;"
    "ALTER TABLE runs ADD COLUMN versions TEXT;"
    "ALTER TABLE runs ADD COLUMN pid INTEGER;"
    "ALTER TABLE runs ADD COLUMN n_cells INTEGER;"
    "ALTER TABLE runs ADD COLUMN n_done INTEGER;"
    "ALTER TABLE runs ADD COLUMN error TEXT;"
    "CREATE TABLE latency(id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs(id),"
    " cell_key TEXT, method TEXT NOT NULL, params TEXT, device TEXT NOT NULL, shape TEXT NOT NULL,"
    " n_tokens INTEGER NOT NULL, dtype TEXT NOT NULL, repetitions INTEGER NOT NULL,"
    " median_ms REAL NOT NULL, p10_ms REAL, p90_ms REAL, bytes_moved REAL, gbps REAL);"
    "CREATE INDEX latency_run ON latency(run_id);"
    "UPDATE schema_version SET version = 2;"
    "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash, host,"
    " started_at, status, device) VALUES(1, 'old', 'overhead', 'x.lua', 'experiment{}', 'abc', 'h',"
    " '2026-01-01T00:00:00Z', 'done', 'cpu: old');"
    "INSERT INTO cells VALUES('k1', 'old', 'fidelity', 'def', NULL, NULL, 'synthetic', NULL,"
    " 'seed=1', 'tiny', 64, 1, 'snapkv', 'snapkv', '{}', 0.2, 0, NULL);"
    "INSERT INTO results VALUES('k1', 1, NULL, 0, 1.5, 0, 0, 100, 20, NULL, '2026-01-01T00:00:30Z');"
    "INSERT INTO scores VALUES('k1', 'mean_rel_err', 0.25);"
    "INSERT INTO latency(run_id, method, device, shape, n_tokens, dtype, repetitions, median_ms)"
    " VALUES(1, 'snapkv', 'cpu', 'tiny', 1024, 'F32', 20, 1.25);";

static long long q1(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* A row with hand-picked numbers; the caller changes what it tests. */
static kvs_engine_bench_row sample_row(void) {
    kvs_engine_bench_row r = {
        .model = "Gemma 3 270m", .model_sha256 = "ab12", .model_path = "/m/gemma.gguf",
        .arch = "gemma3", .quant_types = "Q4_K Q8_0 F32", .device = "cpu", .prompt_len = 2048,
        .gen_tokens = 64, .threads = 2, .repetitions = 3, .prefill_tok_s = 512.5,
        .prefill_tok_s_p10 = 500.25, .prefill_tok_s_p90 = 520.75, .decode_tok_s = 41.5,
        .decode_tok_s_p10 = 40.125, .decode_tok_s_p90 = 42.875, .prefill_cpu_tok_s = 530,
        .decode_cpu_tok_s = 44, .load_avg_before = 0.5, .host_cpu = "Test CPU @ 1GHz",
        .build_type = "release"};
    return r;
}

static int64_t bench_run(kvs_store *s, kvs_err *err) {
    kvs_run_info info = {"engine-bench", "bench", NULL, "kvsieve bench --model x", "h", NULL, NULL, 1};
    int64_t run = 0;
    CHECK_OK(kvs_store_run_begin(s, &info, &run, err), err);
    return run;
}

static void test_migration(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/v2.db", dir);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    char *msg = NULL;
    CHECK_MSG(sqlite3_exec(h, V2, NULL, NULL, &msg) == SQLITE_OK, "v2 sql: %s", msg ? msg : "");
    sqlite3_free(msg);
    sqlite3_close(h);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK_EQ_INT(kvs_store_schema_version(s), KVS_STORE_SCHEMA_VERSION);
    h = kvs_store_db(s);
    CHECK_EQ_INT(q1(h, "SELECT version FROM schema_version"), KVS_STORE_SCHEMA_VERSION);
    /* old data kept */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores WHERE cell_key='k1' AND value=0.25"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency WHERE median_ms=1.25 AND run_id=1"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id=1 AND kind='overhead'"), 1);
    /* the new table is there, empty, and takes a row */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM engine_bench"), 0);
    int64_t run = bench_run(s, &err);
    CHECK_EQ_INT(run, 2);
    kvs_engine_bench_row r = sample_row();
    int64_t id = 0;
    CHECK_OK(kvs_store_put_engine_bench(s, run, &r, &id, &err), &err);
    CHECK_EQ_INT(id, 1);
    kvs_store_close(s);
    /* reopening does not migrate again: the row is still there */
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK_EQ_INT(q1(kvs_store_db(s), "SELECT count(*) FROM engine_bench"), 1);
    kvs_store_close(s);
}

static void test_roundtrip(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/rt.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    sqlite3 *h = kvs_store_db(s);
    int64_t run = bench_run(s, &err);
    kvs_engine_bench_row r = sample_row();
    int64_t id = 0;
    CHECK_OK(kvs_store_put_engine_bench(s, run, &r, &id, &err), &err);
    CHECK_OK(kvs_store_run_end(s, run, "done", 1, NULL, &err), &err);
    sqlite3_stmt *st = NULL;
    CHECK(sqlite3_prepare_v2(h,
                             "SELECT e.run_id, model, model_sha256, model_path, arch, quant_types, e.device,"
                             " prompt_len, gen_tokens, threads, repetitions, prefill_tok_s, prefill_tok_s_p10,"
                             " prefill_tok_s_p90, decode_tok_s, decode_tok_s_p10, decode_tok_s_p90,"
                             " prefill_cpu_tok_s, decode_cpu_tok_s, load_avg_before, host_cpu, build_type,"
                             " finished_at, ru.kind, ru.status, ru.experiment"
                             " FROM engine_bench e JOIN runs ru ON ru.id = e.run_id WHERE e.id = ?",
                             -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_int64(st, 1, id);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
#define TXT(i) ((const char *)sqlite3_column_text(st, (i)))
    CHECK_EQ_INT(sqlite3_column_int64(st, 0), run);
    CHECK_STR_EQ(TXT(1), "Gemma 3 270m");
    CHECK_STR_EQ(TXT(2), "ab12");
    CHECK_STR_EQ(TXT(3), "/m/gemma.gguf");
    CHECK_STR_EQ(TXT(4), "gemma3");
    CHECK_STR_EQ(TXT(5), "Q4_K Q8_0 F32");
    CHECK_STR_EQ(TXT(6), "cpu");
    CHECK_EQ_INT(sqlite3_column_int64(st, 7), 2048);
    CHECK_EQ_INT(sqlite3_column_int64(st, 8), 64);
    CHECK_EQ_INT(sqlite3_column_int64(st, 9), 2);
    CHECK_EQ_INT(sqlite3_column_int64(st, 10), 3);
    const double want[8] = {512.5, 500.25, 520.75, 41.5, 40.125, 42.875, 530, 44};
    for (int k = 0; k < 8; k++) CHECK_MSG(sqlite3_column_double(st, 11 + k) == want[k], "column %d", 11 + k);
    CHECK(sqlite3_column_double(st, 19) == 0.5);
    CHECK_STR_EQ(TXT(20), "Test CPU @ 1GHz");
    CHECK_STR_EQ(TXT(21), "release");
    CHECK(TXT(22) && strlen(TXT(22)) == 20 && TXT(22)[10] == 'T'); /* ISO-8601 UTC */
    CHECK_STR_EQ(TXT(23), "bench");
    CHECK_STR_EQ(TXT(24), "done");
    CHECK_STR_EQ(TXT(25), "engine-bench");
#undef TXT
    sqlite3_finalize(st);

    /* one repetition: no percentiles, no load average, host CPU from the system */
    r = sample_row();
    r.repetitions = 1;
    r.prefill_tok_s_p10 = r.prefill_tok_s_p90 = NAN;
    r.load_avg_before = -1;
    r.host_cpu = NULL;
    r.device = NULL;
    CHECK_OK(kvs_store_put_engine_bench(s, run, &r, &id, &err), &err);
    char want_cpu[256], sql[256];
    kvs_store_host_cpu(want_cpu, sizeof want_cpu);
    CHECK(want_cpu[0] != '\0');
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM engine_bench WHERE id=%lld AND prefill_tok_s_p10 IS NULL AND"
             " prefill_tok_s_p90 IS NULL AND load_avg_before IS NULL AND device='cpu' AND"
             " decode_tok_s_p10=40.125 AND host_cpu IS NOT NULL",
             (long long)id);
    CHECK_EQ_INT(q1(h, sql), 1);
    CHECK(sqlite3_prepare_v2(h, "SELECT host_cpu FROM engine_bench WHERE id=?", -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_int64(st, 1, id);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    CHECK_STR_EQ((const char *)sqlite3_column_text(st, 0), want_cpu);
    sqlite3_finalize(st);

    /* refused rows name the field and the database; nothing is written */
    long long before = q1(h, "SELECT count(*) FROM engine_bench");
    r = sample_row();
    r.repetitions = 0;
    CHECK_FAILS(kvs_store_put_engine_bench(s, run, &r, NULL, &err), KVS_ERR_INVALID, &err, "repetitions 0");
    CHECK(strstr(err.msg, "rt.db") != NULL);
    r = sample_row();
    r.model_sha256 = NULL;
    CHECK_FAILS(kvs_store_put_engine_bench(s, run, &r, NULL, &err), KVS_ERR_INVALID, &err, "model_sha256");
    r = sample_row();
    r.decode_tok_s = NAN;
    CHECK_FAILS(kvs_store_put_engine_bench(s, run, &r, NULL, &err), KVS_ERR_INVALID, &err, "decode");
    r = sample_row();
    CHECK_FAILS(kvs_store_put_engine_bench(s, 999, &r, NULL, &err), KVS_ERR_IO, &err, "engine_bench");
    CHECK(strstr(err.msg, "rt.db") != NULL);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM engine_bench"), before);
    kvs_store_close(s);
}

/* The report of f written to a string (caller frees). */
static char *report(kvs_store *s, kvs_report_opts *o, kvs_status *rc, kvs_err *err) {
    char path[256];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    FILE *f = fopen(path, "w+");
    if (!f) return NULL;
    *rc = kvs_report_write(s, o, f, err);
    long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (t) t[n] = '\0';
    fclose(f);
    return t;
}

static void test_report(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/rep.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    /* run 1: an older row that a newer one with the same key replaces */
    int64_t run1 = bench_run(s, &err);
    kvs_engine_bench_row r = sample_row();
    r.prefill_tok_s = 111;
    CHECK_OK(kvs_store_put_engine_bench(s, run1, &r, NULL, &err), &err);
    /* run 2: the newest 2-thread row, and a 1-thread row without percentiles */
    int64_t run2 = bench_run(s, &err);
    r = sample_row();
    CHECK_OK(kvs_store_put_engine_bench(s, run2, &r, NULL, &err), &err);
    r.threads = 1;
    r.repetitions = 1;
    r.prefill_tok_s = 300;
    r.prefill_tok_s_p10 = r.prefill_tok_s_p90 = r.decode_tok_s_p10 = r.decode_tok_s_p90 = NAN;
    CHECK_OK(kvs_store_put_engine_bench(s, run2, &r, NULL, &err), &err);

    kvs_report_opts o = {NULL, 0, KVS_REPORT_MD, 1000, 20260};
    kvs_status rc = KVS_OK;
    char *t = report(s, &o, &rc, &err); /* only bench rows: a report, not "no results" */
    CHECK_OK(rc, &err);
    CHECK_MSG(t && strstr(t, "## engine throughput\n"), "%s", t ? t : "");
    CHECK(t && strstr(t, "| Gemma 3 270m | cpu | 2048 | 64 | 2 | release | 3 | 512.5 [500.2, 520.8] | "
                         "41.5 [40.12, 42.88] | 2 |\n"));
    CHECK(t && strstr(t, "| Gemma 3 270m | cpu | 2048 | 64 | 1 | release | 1 | 300 [-, -] | 41.5 [-, -] | 2 |\n"));
    CHECK(t && !strstr(t, "| 111 ")); /* replaced by run 2's row */
    /* 1 thread sorts before 2 */
    CHECK(t && strstr(t, "| 1 | release |") < strstr(t, "| 2 | release |"));
    free(t);

    o.format = KVS_REPORT_CSV;
    t = report(s, &o, &rc, &err);
    CHECK_OK(rc, &err);
    CHECK(t && strstr(t, "\nengine_model,device,prompt_len,gen_tokens,threads,build,repetitions,"
                         "prefill_tok_s,prefill_tok_s_p10,prefill_tok_s_p90,decode_tok_s,decode_tok_s_p10,"
                         "decode_tok_s_p90,run_id\n"));
    CHECK(t && strstr(t, "\nGemma 3 270m,cpu,2048,64,2,release,3,512.5,500.25,520.75,41.5,40.125,42.875,2\n"));
    CHECK(t && strstr(t, "\nGemma 3 270m,cpu,2048,64,1,release,1,300,,,41.5,,,2\n"));
    free(t);

    o.format = KVS_REPORT_JSON;
    t = report(s, &o, &rc, &err);
    CHECK_OK(rc, &err);
    CHECK(t && strstr(t, "\n], \"engine\": [\n  {\"model\": \"Gemma 3 270m\", \"device\": \"cpu\","));
    CHECK(t && strstr(t, "\"threads\": 2, \"build\": \"release\", \"repetitions\": 3, \"prefill_tok_s\": 512.5,"
                         " \"prefill_tok_s_p10\": 500.25, \"prefill_tok_s_p90\": 520.75, \"decode_tok_s\": 41.5,"
                         " \"decode_tok_s_p10\": 40.125, \"decode_tok_s_p90\": 42.875, \"run_id\": 2}"));
    CHECK(t && strstr(t, "\"prefill_tok_s_p10\": null"));
    size_t n = t ? strlen(t) : 0;
    CHECK(n > 4 && !strcmp(t + n - 3, "]}\n")); /* one object, closed once */
    free(t);

    o.format = KVS_REPORT_LATEX;
    t = report(s, &o, &rc, &err);
    CHECK_OK(rc, &err);
    CHECK(t && strstr(t, "Gemma 3 270m & cpu & 2048 & 64 & 2 & release & 3 & 512.5 [500.2, 520.8] & "
                         "41.5 [40.12, 42.88] \\\\\n"));
    free(t);

    /* filters: the run's experiment and id */
    o.format = KVS_REPORT_MD;
    o.experiment = "engine-bench";
    t = report(s, &o, &rc, &err);
    CHECK_OK(rc, &err);
    CHECK(t && strstr(t, "| 512.5 ["));
    free(t);
    o.experiment = NULL;
    o.run_id = run1; /* run 1's row is not the newest of its key: nothing left */
    t = report(s, &o, &rc, &err);
    CHECK(rc == KVS_ERR_NOTFOUND && strstr(err.msg, "no results written by run 1"));
    free(t);
    o.run_id = 0;
    o.experiment = "nope";
    t = report(s, &o, &rc, &err);
    CHECK(rc == KVS_ERR_NOTFOUND && strstr(err.msg, "no results for experiment 'nope'"));
    free(t);
    kvs_store_close(s);

    /* an empty database still says so */
    snprintf(db, sizeof db, "%s/empty.db", dir);
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    o.experiment = NULL;
    t = report(s, &o, &rc, &err);
    CHECK(rc == KVS_ERR_NOTFOUND && strstr(err.msg, "holds no results yet"));
    free(t);
    kvs_store_close(s);
}

int main(void) {
    if (eval_tmpdir(dir, "benchstore")) return 1;
    test_migration();
    test_roundtrip();
    test_report();
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_bench_store");
}
