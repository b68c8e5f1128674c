/* test_eval_run.c -- the fidelity runner end to end on a tiny synthetic
 * shape: scores land in the store with provenance; resume skips finished
 * cells exactly; --limit and the stop flag; kill -9 in the middle of a run
 * leaves a consistent database that resumes to the full grid; two runs
 * writing one database at once; dry run; task kind without the kvsieve binary. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <time.h>

static char dir[64];

static const char *CFG =
    "experiment {\n"
    "  name = \"smoke\",\n"
    "  dataset = synthetic { shape = \"tiny\", n_tokens = { 64, 96 }, seeds = { 1, 2 } },\n"
    "  methods = { \"full\", \"random\", \"streamingllm\", \"h2o\", \"snapkv\", \"lookm\", \"meda\", \"flashcache\" },\n"
    "  budgets = { 0.25, 0.5 },\n"
    "  params = { snapkv = { window = 8 } },\n"
    "}\n";
enum { CFG_CELLS = 4 * (1 + 7 * 2) };

static const char *BIG =
    "experiment {\n"
    "  name = \"big\",\n"
    "  dataset = synthetic { shape = \"tiny\", n_tokens = { 64, 80 }, seeds = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 } },\n"
    "  methods = { \"full\", \"random\", \"streamingllm\", \"snapkv\", \"flashcache\" },\n"
    "  budgets = { 0.2, 0.3, 0.4, 0.5 },\n"
    "  params = { snapkv = { window = 8 }, random = { seed = { 1, 2, 3 } } },\n"
    "}\n";
enum { BIG_CELLS = 20 * (1 + 3 * 4 + 4 + 4 + 4) };

/* Slower cells (a real shape) so that a kill lands in the middle. */
static const char *KILL =
    "experiment {\n"
    "  name = \"kill\",\n"
    "  dataset = synthetic { shape = \"gemma3-270m\", n_tokens = 256, seeds = { 1, 2, 3 } },\n"
    "  methods = { \"full\", \"random\", \"streamingllm\", \"snapkv\", \"flashcache\" },\n"
    "  budgets = { 0.2, 0.3, 0.5 },\n"
    "}\n";
enum { KILL_CELLS = 3 * (1 + 4 * 3) };

static long long q1(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
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

static int integrity_ok(sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    int ok = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        ok = !strcmp((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    return ok;
}

static kvs_status run_cfg(const char *cfg_path, const char *db, int max_cells,
                          volatile sig_atomic_t *stop, kvs_run_summary *sum, kvs_err *err) {
    kvs_config cfg;
    kvs_store *s = NULL;
    kvs_status rc = kvs_config_load(cfg_path, NULL, 0, &cfg, err);
    if (rc) return rc;
    if ((rc = kvs_store_open(db, &s, err))) {
        kvs_config_free(&cfg);
        return rc;
    }
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    o.max_cells = max_cells;
    o.stop = stop;
    rc = kvs_run_config(s, &cfg, &o, sum, err);
    kvs_store_close(s);
    kvs_config_free(&cfg);
    return rc;
}

static void test_end_to_end(void) {
    char cfg[256], db[256];
    kvs_err err = {0};
    kvs_run_summary sum;
    eval_write(dir, "smoke.lua", CFG, cfg, sizeof cfg);
    snprintf(db, sizeof db, "%s/sub/folder/r.db", dir); /* the folder is created */
    CHECK_OK(run_cfg(cfg, db, 0, NULL, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, CFG_CELLS);
    CHECK_EQ_INT(sum.n_done, CFG_CELLS);
    CHECK_EQ_INT(sum.n_already, 0);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells"), CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status='done' AND n_done=60 AND n_cells=60"), 1);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE versions LIKE '%\"sqlite\":\"3.%' AND "
                       "versions LIKE '%\"lua\":\"Lua 5.4%' AND kvsieve_version IS NOT NULL AND "
                       "host IS NOT NULL AND device LIKE 'cpu:%' AND length(config_hash)=64 AND "
                       "config_text LIKE '%smoke%' AND ended_at IS NOT NULL"),
                 1);
    /* the run's accounting: its cells, wall and CPU seconds (this process:
     * fidelity runs in-process), and compress + apply summed over its cells */
    CHECK_EQ_INT(sum.acct.cells, CFG_CELLS);
    CHECK(sum.acct.wall_s > 0 && sum.acct.cpu_s > 0);
    CHECK(sum.acct.prefill_ms == 0 && sum.acct.decode_ms == 0 && sum.acct.requests == 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE wall_s > 0 AND cpu_s > 0 AND requests = 0 AND "
                       "cpu_scope = 'kvsieve run (in-process)' AND prefill_ms = 0 AND decode_ms = 0"), 1);
    CHECK_NEAR(qd(h, "SELECT compress_ms FROM runs"), sum.acct.compress_ms, 1e-6);
    CHECK_NEAR(qd(h, "SELECT wall_s FROM runs"), sum.acct.wall_s, 1e-9);
    CHECK_NEAR(qd(h, "SELECT sum(s.value) FROM scores s WHERE s.metric IN ('compress_ms', 'apply_ms')"),
               sum.acct.compress_ms, 1e-6 * sum.acct.compress_ms + 1e-9);
    CHECK(sum.acct.compress_ms > 0);
    {
        char line[1024] = "";
        FILE *pf = tmpfile();
        if (pf) {
            kvs_run_account_print(pf, &sum.acct);
            rewind(pf);
            if (!fgets(line, sizeof line, pf)) line[0] = '\0';
            fclose(pf);
        }
        CHECK(strstr(line, "accounting: 60 cells in ") && strstr(line, " CPU-s (kvsieve run (in-process)), ") &&
              strstr(line, " cells per CPU-second; prefill 0%, compress 100%, decode 0% of "));
    }
    /* full keeps everything: zero error, all outliers retained */
    CHECK_NEAR(qd(h, "SELECT max(s.value) FROM scores s JOIN cells c ON c.key=s.cell_key "
                     "WHERE c.method='full' AND s.metric='mean_rel_err'"), 0.0, 1e-6);
    CHECK_NEAR(qd(h, "SELECT min(s.value) FROM scores s JOIN cells c ON c.key=s.cell_key "
                     "WHERE c.method='full' AND s.metric='retention'"), 1.0, 1e-12);
    /* compressed variants keep what the budget says and err more than full */
    CHECK_NEAR(qd(h, "SELECT avg(s.value) FROM scores s JOIN cells c ON c.key=s.cell_key "
                     "WHERE c.method='flashcache' AND c.budget_ratio=0.25 AND s.metric='kept_ratio'"),
               0.25, 0.02);
    CHECK(qd(h, "SELECT min(s.value) FROM scores s JOIN cells c ON c.key=s.cell_key "
                "WHERE c.method<>'full' AND s.metric='mean_rel_err'") > 0);
    CHECK(qd(h, "SELECT min(kv_bytes_after * 1.0 / kv_bytes_before) FROM results r JOIN cells c "
                "ON c.key=r.cell_key WHERE c.method='snapkv' AND c.budget_ratio=0.25") < 0.3);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells WHERE label='snapkv window=8'"), 8);
    /* every result has its scores */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r WHERE (SELECT count(*) FROM scores s "
                       "WHERE s.cell_key=r.cell_key) < 5"), 0);
    sqlite3_close(h);

    /* resume: nothing to do */
    CHECK_OK(run_cfg(cfg, db, 0, NULL, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 0);
    CHECK_EQ_INT(sum.n_already, CFG_CELLS);
    CHECK_EQ_INT(sum.run_id, 0); /* no run started: nothing accounted */
    CHECK(sum.acct.cells == 0 && sum.acct.wall_s == 0);

    /* --limit then resume: the same keys, exactly once */
    char db2[256];
    snprintf(db2, sizeof db2, "%s/limit.db", dir);
    CHECK_OK(run_cfg(cfg, db2, 7, NULL, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 7);
    CHECK(sum.interrupted);
    volatile sig_atomic_t stop = 1;
    CHECK_OK(run_cfg(cfg, db2, 0, &stop, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 0);
    CHECK(sum.interrupted);
    CHECK_OK(run_cfg(cfg, db2, 0, NULL, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, CFG_CELLS - 7);
    CHECK_EQ_INT(sum.n_already, 7);
    CHECK(sqlite3_open(db2, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), CFG_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status='interrupted'"), 2);
    char sql[512];
    snprintf(sql, sizeof sql, "ATTACH '%s' AS a", db);
    CHECK(sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells c JOIN a.cells d ON c.key = d.key"), CFG_CELLS);
    /* the metrics are deterministic: the same cell gives the same error in both databases */
    CHECK_NEAR(qd(h, "SELECT max(abs(s.value - t.value)) FROM scores s JOIN a.scores t ON "
                     "s.cell_key=t.cell_key AND s.metric=t.metric WHERE s.metric LIKE '%rel_err'"),
               0.0, 1e-12);
    sqlite3_close(h);
}

/* Wait for a child; returns its exit code (or 128+signal). */
static int wait_child(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static pid_t spawn_run(const char *cfg, const char *db) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        kvs_err err = {0};
        kvs_run_summary sum;
        kvs_status rc = run_cfg(cfg, db, 0, NULL, &sum, &err);
        if (rc) fprintf(stderr, "child %d: %s\n", (int)getpid(), err.msg);
        _exit(rc ? 1 : 0);
    }
    return pid;
}

static void test_kill9(void) {
    char cfg[256], db[256];
    eval_write(dir, "kill.lua", KILL, cfg, sizeof cfg);
    snprintf(db, sizeof db, "%s/kill.db", dir);
    /* create the schema first so the poll below can read */
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    kvs_store_close(s);
    pid_t pid = spawn_run(cfg, db);
    CHECK(pid > 0);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    sqlite3_busy_timeout(h, 10000);
    long long at_kill = 0;
    for (int i = 0; i < 20000; i++) {
        at_kill = q1(h, "SELECT count(*) FROM results");
        if (at_kill >= 3) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    CHECK_EQ_INT(wait_child(pid), 128 + SIGKILL);
    long long after = q1(h, "SELECT count(*) FROM results");
    printf("kill -9 after %lld of %d cells were stored\n", after, KILL_CELLS);
    CHECK_MSG(after >= 3 && after < KILL_CELLS, "killed with %lld of %d cells stored", after, KILL_CELLS);
    CHECK(integrity_ok(h));
    /* consistent: every result has its cell and all its scores; no orphans */
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r LEFT JOIN cells c ON c.key=r.cell_key WHERE c.key IS NULL"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM cells c LEFT JOIN results r ON c.key=r.cell_key WHERE r.cell_key IS NULL"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results r WHERE (SELECT count(*) FROM scores s WHERE s.cell_key=r.cell_key) < 5"), 0);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status='running'"), 1);
    sqlite3_close(h);
    /* resume: exactly the missing cells */
    kvs_run_summary sum;
    CHECK_OK(run_cfg(cfg, db, 0, NULL, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_already, after);
    CHECK_EQ_INT(sum.n_done, KILL_CELLS - after);
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), KILL_CELLS);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status='abandoned'"), 1);
    CHECK(integrity_ok(h));
    sqlite3_close(h);
}

static void test_concurrent(void) {
    char cfg[256], db[256];
    eval_write(dir, "conc.lua", BIG, cfg, sizeof cfg);
    snprintf(db, sizeof db, "%s/conc.db", dir);
    pid_t a = spawn_run(cfg, db), b = spawn_run(cfg, db);
    CHECK_EQ_INT(wait_child(a), 0);
    CHECK_EQ_INT(wait_child(b), 0);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open(db, &h) == SQLITE_OK);
    CHECK(integrity_ok(h));
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM results"), BIG_CELLS);
    /* two runs when they overlapped; one when the second started after the first had stored every cell
     * (it then finds nothing to do and opens no run: a loaded machine may start it that late) */
    const int nruns = q1(h, "SELECT count(*) FROM runs");
    CHECK_MSG(nruns == 1 || nruns == 2, "%d runs for two concurrent processes", nruns);
    CHECK_EQ_INT(q1(h, "SELECT count(*) FROM runs WHERE status='done'"), nruns);
    CHECK_EQ_INT(q1(h, "SELECT sum(n_done) >= 500 FROM runs"), 1); /* BIG_CELLS: a cell may be run by both */
    CHECK_EQ_INT(q1(h, "SELECT schema_version.version FROM schema_version"), KVS_STORE_SCHEMA_VERSION);
    sqlite3_close(h);
}

static void test_dry_and_task(void) {
    char cfg[256], db[256], out[256];
    kvs_err err = {0};
    eval_write(dir, "dry.lua", CFG, cfg, sizeof cfg);
    snprintf(db, sizeof db, "%s/dry.db", dir);
    CHECK_OK(run_cfg(cfg, db, 5, NULL, &(kvs_run_summary){0}, &err), &err);
    kvs_config c;
    kvs_store *s = NULL;
    CHECK_OK(kvs_config_load(cfg, NULL, 0, &c, &err), &err);
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    snprintf(out, sizeof out, "%s/dry.txt", dir);
    FILE *f = fopen(out, "w+");
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    o.dry_run = 1;
    o.progress = f;
    kvs_run_summary sum;
    CHECK_OK(kvs_run_config(s, &c, &o, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, CFG_CELLS);
    CHECK_EQ_INT(sum.n_already, 5);
    CHECK_EQ_INT(sum.n_done, 0);
    rewind(f);
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CHECK(strstr(text, "60 total, 5 already done, 55 to run") != NULL);
    CHECK(strstr(text, "todo") && strstr(text, "done "));
    CHECK(strstr(text, "tiny N=96 seed=2  flashcache  budget 0.5") != NULL);
    kvs_config_free(&c);
    const char *task =
        "experiment { name = \"t\", kind = \"task\", dataset = niah { lengths = 1024, depths = 0.5 },\n"
        "  methods = { \"full\" }, budgets = 0.2, metrics = \"contains\" }\n";
    eval_write(dir, "task.lua", task, cfg, sizeof cfg);
    CHECK_OK(kvs_config_load(cfg, NULL, 0, &c, &err), &err);
    memset(&o, 0, sizeof o);
    /* kind task runs in eval/task.c (tests/task); without the kvsieve binary
     * an embedded backend cannot be started */
    CHECK_FAILS(kvs_run_config(s, &c, &o, &sum, &err), KVS_ERR_UNSUPPORTED, &err,
                "needs the kvsieve binary");
    kvs_config_free(&c);
    kvs_store_close(s);
}

int main(void) {
    if (eval_tmpdir(dir, "run")) return 1;
    double t0 = kvs_now_ms();
    test_end_to_end();
    double t1 = kvs_now_ms();
    test_kill9();
    double t2 = kvs_now_ms();
    test_concurrent();
    double t3 = kvs_now_ms();
    test_dry_and_task();
    printf("end-to-end %.0f ms, kill -9 %.0f ms, concurrent %.0f ms\n", t1 - t0, t2 - t1, t3 - t2);
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_run");
}
