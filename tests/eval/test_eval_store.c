/* test_eval_store.c -- the results store: migration from schema versions 1
 * and 4 (their SQL is written out here, as it shipped), data kept across the
 * migration, run accounting on a migrated run; a newer schema is refused; batched puts; a finished cell is
 * never overwritten; two processes writing at once; bootstrap CI
 * determinism and coverage. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sqlite3.h>
#include <sys/wait.h>

static char dir[64];

/* Schema version 1, verbatim. */
static const char *V1 =
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
    "INSERT INTO runs VALUES(1, 'old', 'x.lua', 'experiment{}', 'abc', NULL, 'h', '0.0.9',"
    " '2026-01-01T00:00:00Z', '2026-01-01T00:01:00Z', 'done');"
    "INSERT INTO cells VALUES('k1', 'old', 'fidelity', 'def', NULL, NULL, 'synthetic', NULL,"
    " 'seed=1', 'tiny', 64, 1, 'snapkv', 'snapkv', '{}', 0.2, 0, NULL);"
    "INSERT INTO results VALUES('k1', 1, NULL, 0, 1.5, 0, 0, 100, 20, NULL, '2026-01-01T00:00:30Z');"
    "INSERT INTO scores VALUES('k1', 'mean_rel_err', 0.25);";

/* From version 1 to 4, as those migrations shipped, and a version-4 run
 * (a merged shard) with its accounting not yet measured. */
static const char *V1_TO_V4 =
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
    "CREATE TABLE engine_bench(id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),"
    " model TEXT NOT NULL, model_sha256 TEXT NOT NULL, model_path TEXT, arch TEXT, quant_types TEXT,"
    " device TEXT NOT NULL, prompt_len INTEGER NOT NULL, gen_tokens INTEGER NOT NULL,"
    " threads INTEGER NOT NULL, repetitions INTEGER NOT NULL,"
    " prefill_tok_s REAL NOT NULL, prefill_tok_s_p10 REAL, prefill_tok_s_p90 REAL,"
    " decode_tok_s REAL NOT NULL, decode_tok_s_p10 REAL, decode_tok_s_p90 REAL,"
    " prefill_cpu_tok_s REAL, decode_cpu_tok_s REAL, load_avg_before REAL, host_cpu TEXT,"
    " build_type TEXT NOT NULL, finished_at TEXT NOT NULL);"
    "CREATE INDEX engine_bench_run ON engine_bench(run_id);"
    "ALTER TABLE runs ADD COLUMN shard TEXT;"
    "ALTER TABLE runs ADD COLUMN merged_from TEXT;"
    "ALTER TABLE cells ADD COLUMN model_bytes INTEGER;"
    "UPDATE schema_version SET version = 4;"
    "UPDATE runs SET kind = 'task', pid = 42, n_cells = 3, n_done = 1, shard = '1/4',"
    " merged_from = 'shard-1.db#7' WHERE id = 1;"
    "UPDATE cells SET model_bytes = 123456 WHERE key = 'k1';";

static long long q1(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void test_migration(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/v1.db", dir);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, V1, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK_EQ_INT(kvs_store_schema_version(s), KVS_STORE_SCHEMA_VERSION);
    h = kvs_store_db(s);
    CHECK_EQ_INT(q1(h, "SELECT version FROM schema_version"), KVS_STORE_SCHEMA_VERSION);
    /* old data kept, new columns and tables usable */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores WHERE cell_key='k1' AND value=0.25"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id=1 AND kind='fidelity' AND device IS NULL"), 1);
    int done = 0;
    CHECK_OK(kvs_store_is_done(s, "k1", &done, &err), &err);
    CHECK_EQ_INT(done, 1);
    kvs_latency_row lat = {NULL, "snapkv", "{}", "cpu", "tiny", "F32", 1024, 20, 1.0, 0.9, 1.2, 1e6, 1.0};
    CHECK_OK(kvs_store_put_latency(s, 1, &lat, 1, &err), &err);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM latency"), 1);
    kvs_run_info info = {"new", "fidelity", "x.lua", "experiment{}", "def", NULL, NULL, 3};
    int64_t run = 0;
    CHECK_OK(kvs_store_run_begin(s, &info, &run, &err), &err);
    CHECK_EQ_INT(run, 2);
    CHECK_OK(kvs_store_run_end(s, run, "done", 3, NULL, &err), &err);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id=2 AND status='done' AND pid > 0 AND n_done=3"), 1);
    kvs_store_close(s);
    /* reopening does not migrate again */
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    kvs_store_close(s);
    /* a database from a newer kvsieve is refused, not touched */
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, "UPDATE schema_version SET version=99", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
    CHECK_FAILS(kvs_store_open(db, &s, &err), KVS_ERR_UNSUPPORTED, &err, "schema version 99 is newer");
    /* not a database */
    char bad[256];
    eval_write(dir, "junk.db", "this is not an sqlite file, just text padding padding padding padding "
                               "padding padding padding padding",
               bad, sizeof bad);
    CHECK(kvs_store_open(bad, &s, &err) != KVS_OK);
    CHECK(strstr(err.msg, "junk.db") != NULL);
}

/* A version-4 database (written by the kvsieve before run accounting)
 * migrates to the current version with every stored value kept; its runs
 * read as not measured (NULL) and take accounting afterwards. */
static void test_migration_v4(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/v4.db", dir);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, V1, NULL, NULL, NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(h, V1_TO_V4, NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT version FROM schema_version"), 4);
    sqlite3_close(h);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK_EQ_INT(kvs_store_schema_version(s), KVS_STORE_SCHEMA_VERSION);
    h = kvs_store_db(s);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id = 1 AND experiment = 'old' AND kind = 'task'"
                       " AND pid = 42 AND n_cells = 3 AND n_done = 1 AND shard = '1/4'"
                       " AND merged_from = 'shard-1.db#7' AND started_at = '2026-01-01T00:00:00Z'"
                       " AND ended_at = '2026-01-01T00:01:00Z' AND status = 'done'"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id = 1 AND wall_s IS NULL AND cpu_s IS NULL"
                       " AND cpu_scope IS NULL AND requests IS NULL AND prefill_ms IS NULL"
                       " AND compress_ms IS NULL AND decode_ms IS NULL"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells WHERE key = 'k1' AND model_bytes = 123456"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results WHERE cell_key = 'k1' AND compress_ms = 1.5"
                       " AND kv_bytes_after = 20"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores WHERE cell_key = 'k1' AND value = 0.25"), 1);
    kvs_run_account a = {.cells = 1, .requests = 2, .wall_s = 12.5, .cpu_s = 20.25,
                         .cpu_scope = "scope", .prefill_ms = 300, .compress_ms = 40, .decode_ms = 500};
    CHECK_OK(kvs_store_run_account(s, 1, &a, &err), &err);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id = 1 AND wall_s = 12.5 AND cpu_s = 20.25"
                       " AND cpu_scope = 'scope' AND requests = 2 AND prefill_ms = 300"
                       " AND compress_ms = 40 AND decode_ms = 500 AND n_done = 1"), 1);
    a.cpu_s = -1; /* unknown CPU time is stored as NULL */
    CHECK_OK(kvs_store_run_account(s, 1, &a, &err), &err);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE id = 1 AND cpu_s IS NULL"), 1);
    kvs_store_close(s);
}

/* n rows with keys "<tag>-<i>", 3 scores each, batches of `batch`. */
static kvs_status put_rows(kvs_store *s, int64_t run, const char *tag, int n, int batch, kvs_err *err) {
    kvs_cell_row *c = calloc((size_t)batch, sizeof *c);
    kvs_result_row *r = calloc((size_t)batch, sizeof *r);
    char(*keys)[32] = calloc((size_t)batch, 32);
    kvs_score sc[3] = {{"mean_rel_err", 0.1}, {"max_rel_err", 0.2}, {"retention", 0.9}};
    kvs_status rc = KVS_OK;
    for (int i = 0; i < n && !rc; i += batch) {
        int k = n - i < batch ? n - i : batch;
        for (int j = 0; j < k; j++) {
            snprintf(keys[j], 32, "%s-%d", tag, i + j);
            c[j] = (kvs_cell_row){.key = keys[j], .experiment = tag, .kind = "fidelity",
                                  .definition = keys[j], .dataset = "synthetic", .sample_id = "s",
                                  .method = "snapkv", .label = "snapkv", .params_json = "{}",
                                  .budget_ratio = 0.2};
            r[j] = (kvs_result_row){.compress_ms = 1.0, .n_scores = 3, .scores = sc};
        }
        rc = kvs_store_put(s, run, c, r, k, err);
    }
    free(c);
    free(r);
    free(keys);
    return rc;
}

static void test_writes(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/w.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK_OK(put_rows(s, 0, "a", 250, 100, &err), &err);
    sqlite3 *h = kvs_store_db(s);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), 250);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores"), 750);
    /* a finished cell is not overwritten by a second writer */
    kvs_score other = {"mean_rel_err", 9.0};
    kvs_cell_row c = {.key = "a-3", .experiment = "a", .kind = "fidelity", .definition = "a-3",
                      .method = "snapkv"};
    kvs_result_row r = {.compress_ms = 5, .n_scores = 1, .scores = &other};
    CHECK_OK(kvs_store_put(s, 0, &c, &r, 1, &err), &err);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores WHERE cell_key='a-3' AND metric='mean_rel_err' AND value=0.1"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results WHERE cell_key='a-3' AND compress_ms=1.0"), 1);
    /* a failing batch leaves nothing behind: run_id that does not exist breaks the FK */
    CHECK(put_rows(s, 999, "b", 10, 10, &err) != KVS_OK);
    CHECK(strstr(err.msg, "w.db") != NULL);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells WHERE experiment='b'"), 0);
    kvs_store_close(s);

    /* two processes writing at once */
    fflush(NULL);
    pid_t pids[2];
    for (int p = 0; p < 2; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            kvs_store *cs = NULL;
            kvs_err e = {0};
            int bad = kvs_store_open(db, &cs, &e) != KVS_OK ||
                      put_rows(cs, 0, p ? "q" : "p", 3000, 50, &e) != KVS_OK;
            if (bad) fprintf(stderr, "writer %d: %s\n", p, e.msg);
            kvs_store_close(cs);
            _exit(bad);
        }
    }
    for (int p = 0; p < 2; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    h = kvs_store_db(s);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results WHERE cell_key LIKE 'p-%'"), 3000);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results WHERE cell_key LIKE 'q-%'"), 3000);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM scores"), 3 * 6250);
    sqlite3_stmt *st = NULL;
    sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL);
    CHECK(sqlite3_step(st) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), "ok"));
    sqlite3_finalize(st);
    kvs_store_close(s);
}

static void test_bootstrap(void) {
    double x[50];
    uint64_t rng = 7;
    for (int i = 0; i < 50; i++) x[i] = 1.0 + kvs_rng_normal(&rng);
    double m1, lo1, hi1, m2, lo2, hi2, m3, lo3, hi3;
    kvs_bootstrap_ci(x, 50, 1000, 123, &m1, &lo1, &hi1);
    kvs_bootstrap_ci(x, 50, 1000, 123, &m2, &lo2, &hi2);
    CHECK(m1 == m2 && lo1 == lo2 && hi1 == hi2); /* same seed: bit-identical */
    kvs_bootstrap_ci(x, 50, 1000, 124, &m3, &lo3, &hi3);
    CHECK(m3 == m1 && (lo3 != lo1 || hi3 != hi1)); /* another seed: another CI */
    CHECK(lo1 < m1 && m1 < hi1);
    /* width close to the normal approximation 2 * 1.96 * sd / sqrt(n) */
    double sd = 0;
    for (int i = 0; i < 50; i++) sd += (x[i] - m1) * (x[i] - m1);
    sd = sqrt(sd / 49);
    CHECK_NEAR(hi1 - lo1, 2 * 1.96 * sd / sqrt(50.0), 0.03);
    /* coverage over repeated samples from N(0,1): about 95% */
    int cover = 0;
    for (int t = 0; t < 400; t++) {
        for (int i = 0; i < 50; i++) x[i] = kvs_rng_normal(&rng);
        double m, lo, hi;
        kvs_bootstrap_ci(x, 50, 400, (uint64_t)t, &m, &lo, &hi);
        cover += lo <= 0 && 0 <= hi;
    }
    CHECK_MSG(cover >= 360 && cover <= 392, "coverage %d/400", cover);
    /* degenerate inputs */
    double one = 3.5, m, lo, hi;
    kvs_bootstrap_ci(&one, 1, 1000, 1, &m, &lo, &hi);
    CHECK(m == 3.5 && lo == 3.5 && hi == 3.5);
    double same[4] = {2, 2, 2, 2};
    kvs_bootstrap_ci(same, 4, 1000, 1, &m, &lo, &hi);
    CHECK(m == 2 && lo == 2 && hi == 2);
    /* weighted: NULL or equal weights give the unweighted result exactly;
     * x = {10, 100}, w = {9, 1}: mean (90 + 100) / 10 = 19, CI in [10, 100] */
    double wm, wlo, whi, ones[50];
    for (int i = 0; i < 50; i++) ones[i] = 1.0;
    kvs_bootstrap_ci_weighted(x, NULL, 50, 1000, 5, &wm, &wlo, &whi);
    kvs_bootstrap_ci(x, 50, 1000, 5, &m, &lo, &hi);
    CHECK(wm == m && wlo == lo && whi == hi);
    kvs_bootstrap_ci_weighted(x, ones, 50, 1000, 5, &wm, &wlo, &whi);
    CHECK_NEAR(wm, m, 1e-12);
    CHECK_NEAR(wlo, lo, 1e-12);
    CHECK_NEAR(whi, hi, 1e-12);
    const double xv[2] = {10, 100}, wv[2] = {9, 1};
    kvs_bootstrap_ci_weighted(xv, wv, 2, 1000, 3, &wm, &wlo, &whi);
    CHECK_NEAR(wm, 19.0, 1e-12);
    CHECK(wlo >= 10 && whi <= 100 && wlo < wm && wm < whi);
}

int main(void) {
    if (eval_tmpdir(dir, "store")) return 1;
    test_migration();
    test_migration_v4();
    test_writes();
    test_bootstrap();
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_store");
}
