/*
 * store.c -- the SQLite results store: schema, migrations, provenance, writes.
 *
 * What it is: the only code that writes the results database. Schema history
 * lives in `migrations[]` (index i takes a database from version i to i+1);
 * a fresh database runs them all. WAL journal, busy_timeout, every write in
 * one BEGIN IMMEDIATE transaction, so a killed process loses at most what it
 * had not committed and concurrent writers queue instead of failing.
 * What it is not: no reports (report.c reads with plain SQL), no grid logic;
 * the union of databases (`kvsieve merge`) is store_merge.c, which writes
 * through the same connection.
 */
#include "kvs_eval.h"

#include <assert.h>
#include <errno.h>
#include <fftw3.h>
#include <cjson/cJSON.h>
#include <lua.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

struct kvs_store {
    sqlite3 *db;
    char path[1024];
    int version;
    sqlite3_stmt *ins_cell, *ins_result, *ins_score, *ins_latency, *q_done;
};

/* Version i -> i + 1. Version 1 is the first released schema; the tests
 * keep a copy of its SQL to check the migration. */
static const char *const migrations[] = {
    /* 0 -> 1 */
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
    "INSERT INTO schema_version VALUES(1);",
    /* 1 -> 2: run provenance (kind, device, library versions, pid, counts),
     * the latency table of the overhead study. */
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
    "UPDATE schema_version SET version = 2;",
    /* 2 -> 3: engine throughput rows of `kvsieve bench` (provenance: a runs
     * row of kind 'bench'); tokens/s are wall-clock unless named cpu_. */
    "CREATE TABLE engine_bench(id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),"
    " model TEXT NOT NULL, model_sha256 TEXT NOT NULL, model_path TEXT, arch TEXT, quant_types TEXT,"
    " device TEXT NOT NULL, prompt_len INTEGER NOT NULL, gen_tokens INTEGER NOT NULL,"
    " threads INTEGER NOT NULL, repetitions INTEGER NOT NULL,"
    " prefill_tok_s REAL NOT NULL, prefill_tok_s_p10 REAL, prefill_tok_s_p90 REAL,"
    " decode_tok_s REAL NOT NULL, decode_tok_s_p10 REAL, decode_tok_s_p90 REAL,"
    " prefill_cpu_tok_s REAL, decode_cpu_tok_s REAL, load_avg_before REAL, host_cpu TEXT,"
    " build_type TEXT NOT NULL, finished_at TEXT NOT NULL);"
    "CREATE INDEX engine_bench_run ON engine_bench(run_id);"
    "UPDATE schema_version SET version = 3;",
    /* 3 -> 4: distributed runs: the shard a run covered ("I/N" of
     * `kvsieve run --shard`), for a run copied by `kvsieve merge` the
     * database and run id it came from ("PATH#ID"); a task cell's model file
     * size (what a decode step reads besides the KV: the decode study). */
    "ALTER TABLE runs ADD COLUMN shard TEXT;"
    "ALTER TABLE runs ADD COLUMN merged_from TEXT;"
    "ALTER TABLE cells ADD COLUMN model_bytes INTEGER;"
    "UPDATE schema_version SET version = 4;",
    /* 4 -> 5: where a run's time went (kvs_run_account): wall and CPU
     * seconds and what the CPU time counts, answered requests, and the
     * prefill / compress / decode milliseconds of the work's own clocks.
     * Columns only: older runs keep NULL (not measured). */
    "ALTER TABLE runs ADD COLUMN wall_s REAL;"
    "ALTER TABLE runs ADD COLUMN cpu_s REAL;"
    "ALTER TABLE runs ADD COLUMN cpu_scope TEXT;"
    "ALTER TABLE runs ADD COLUMN requests INTEGER;"
    "ALTER TABLE runs ADD COLUMN prefill_ms REAL;"
    "ALTER TABLE runs ADD COLUMN compress_ms REAL;"
    "ALTER TABLE runs ADD COLUMN decode_ms REAL;"
    "UPDATE schema_version SET version = 5;",
};
_Static_assert(sizeof migrations / sizeof migrations[0] == KVS_STORE_SCHEMA_VERSION,
               "one migration per schema version");

static kvs_status db_fail(kvs_store *s, kvs_err *err, const char *what) {
    return kvs_errorf(err, KVS_ERR_IO, "%s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
}

static kvs_status exec(kvs_store *s, const char *sql, kvs_err *err) {
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        kvs_errorf(err, KVS_ERR_IO, "%s: %.200s: %s", s->path, sql, msg ? msg : "?");
        sqlite3_free(msg);
        return KVS_ERR_IO;
    }
    return KVS_OK;
}

/* Current schema version; 0 for an empty database. -1 on error. */
static int read_version(kvs_store *s) {
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT count(*) FROM sqlite_master WHERE name='schema_version'", -1,
                           &st, NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (v <= 0) return v;
    v = -1;
    if (sqlite3_prepare_v2(s->db, "SELECT version FROM schema_version", -1, &st, NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static kvs_status migrate(kvs_store *s, kvs_err *err) {
    for (;;) {
        /* Take the write lock before reading the version: two processes
         * opening a fresh database at once must not both migrate. */
        if (exec(s, "BEGIN IMMEDIATE", err)) return KVS_ERR_IO;
        int v = read_version(s);
        if (v < 0) {
            exec(s, "ROLLBACK", NULL);
            return db_fail(s, err, "reading schema_version");
        }
        if (v > KVS_STORE_SCHEMA_VERSION) {
            exec(s, "ROLLBACK", NULL);
            return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                              "%s: schema version %d is newer than this kvsieve (%d); upgrade kvsieve",
                              s->path, v, KVS_STORE_SCHEMA_VERSION);
        }
        if (v == KVS_STORE_SCHEMA_VERSION) {
            s->version = v;
            return exec(s, "COMMIT", err);
        }
        kvs_err e2 = {0};
        if (exec(s, migrations[v], &e2)) {
            exec(s, "ROLLBACK", NULL);
            kvs_errorf(err, e2.code, "%s", e2.msg);
            return kvs_err_prefix(err, "migrating schema %d -> %d", v, v + 1);
        }
        if (exec(s, "COMMIT", err)) return KVS_ERR_IO;
    }
}

/* mkdir -p for the folder that holds path. */
static kvs_status make_parent(const char *path, kvs_err *err) {
    char dir[1024];
    if (strlen(path) >= sizeof dir) return kvs_errorf(err, KVS_ERR_INVALID, "database path too long");
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return KVS_OK;
    *slash = '\0';
    for (char *p = dir + 1; ; p++) {
        char c = *p;
        if (c == '/' || c == '\0') {
            *p = '\0';
            if (mkdir(dir, 0777) != 0 && errno != EEXIST)
                return kvs_errorf(err, KVS_ERR_IO, "cannot create folder %s: %s", dir, strerror(errno));
            *p = c;
        }
        if (c == '\0') break;
    }
    return KVS_OK;
}

static kvs_status prepare(kvs_store *s, sqlite3_stmt **st, const char *sql, kvs_err *err) {
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing statement");
    return KVS_OK;
}

kvs_status kvs_store_open(const char *path, kvs_store **out, kvs_err *err) {
    kvs_status rc = KVS_OK;
    *out = NULL;
    if (!path || !*path) return kvs_errorf(err, KVS_ERR_INVALID, "empty database path");
    kvs_store *s = calloc(1, sizeof *s);
    if (!s) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory opening %s", path);
    snprintf(s->path, sizeof s->path, "%s", path);
    if ((rc = make_parent(path, err))) goto cleanup;
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        rc = kvs_errorf(err, KVS_ERR_IO, "cannot open database %s: %s", path,
                        s->db ? sqlite3_errmsg(s->db) : "out of memory");
        goto cleanup;
    }
    sqlite3_busy_timeout(s->db, 30000);
    /* Switching a new database to WAL can report "locked" at once (without
     * the busy handler) while another process does the same: retry. */
    for (int tries = 0;; tries++) {
        kvs_err e2 = {0};
        if (exec(s, "PRAGMA journal_mode=WAL", &e2) == KVS_OK) break;
        int busy = sqlite3_errcode(s->db) == SQLITE_BUSY || sqlite3_errcode(s->db) == SQLITE_LOCKED;
        if (!busy || tries >= 3000) {
            rc = kvs_errorf(err, e2.code, "%s", e2.msg);
            goto cleanup;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if ((rc = exec(s, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", err))) goto cleanup;
    if ((rc = migrate(s, err))) goto cleanup;
    if ((rc = prepare(s, &s->ins_cell,
                      "INSERT OR IGNORE INTO cells(key, experiment, kind, definition, model, model_hash,"
                      " dataset, dataset_version, sample_id, shape, n_tokens, seed, method, label, params,"
                      " budget_ratio, budget_tokens, prompt_hash, model_bytes)"
                      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      err)) ||
        (rc = prepare(s, &s->ins_result,
                      "INSERT OR IGNORE INTO results(cell_key, run_id, prediction, prefill_ms,"
                      " compress_ms, decode_ms, decode_tokens, kv_bytes_before, kv_bytes_after, note,"
                      " finished_at) VALUES(?,?,?,?,?,?,?,?,?,?,strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
                      err)) ||
        (rc = prepare(s, &s->ins_score,
                      "INSERT OR REPLACE INTO scores(cell_key, metric, value) VALUES(?,?,?)", err)) ||
        (rc = prepare(s, &s->ins_latency,
                      "INSERT INTO latency(run_id, cell_key, method, params, device, shape, n_tokens,"
                      " dtype, repetitions, median_ms, p10_ms, p90_ms, bytes_moved, gbps)"
                      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      err)) ||
        (rc = prepare(s, &s->q_done, "SELECT 1 FROM results WHERE cell_key = ?", err)))
        goto cleanup;
    *out = s;
    return KVS_OK;
cleanup:
    kvs_store_close(s);
    return rc;
}

void kvs_store_close(kvs_store *s) {
    if (!s) return;
    sqlite3_finalize(s->ins_cell);
    sqlite3_finalize(s->ins_result);
    sqlite3_finalize(s->ins_score);
    sqlite3_finalize(s->ins_latency);
    sqlite3_finalize(s->q_done);
    sqlite3_close(s->db);
    free(s);
}

int kvs_store_schema_version(kvs_store *s) { return s->version; }
const char *kvs_store_path(const kvs_store *s) { return s->path; }
struct sqlite3 *kvs_store_db(kvs_store *s) { return s->db; }

/* ---- provenance ---------------------------------------------------------- */

static void iso_now(char *buf, size_t n) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* 1 when an executable `name` is on PATH. */
static int on_path(const char *name) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[1024];
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0 && len + strlen(name) + 2 < sizeof buf) {
            memcpy(buf, path, len);
            snprintf(buf + len, sizeof buf - len, "/%s", name);
            if (access(buf, X_OK) == 0) return 1;
        }
        path += len;
        if (*path == ':') path++;
    }
    return 0;
}

/* The git revision of dir ("<sha>" or "<sha>-dirty"), or "" when dir is not
 * in a git work tree or git is not installed. Never an error. */
static void git_revision(const char *dir, char *out, size_t n) {
    out[0] = '\0';
    if (!dir || !*dir || strchr(dir, '\'') || !on_path("git")) return;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char line[128] = "";
    if (!fgets(line, sizeof line, p)) line[0] = '\0';
    if (pclose(p) != 0) return;
    line[strcspn(line, "\r\n")] = '\0';
    if (strlen(line) != 40) return;
    snprintf(cmd, sizeof cmd, "git -C '%s' status --porcelain --untracked-files=no 2>/dev/null", dir);
    int dirty = 0;
    p = popen(cmd, "r");
    if (p) {
        char tmp[256];
        while (fgets(tmp, sizeof tmp, p)) dirty = 1;
        pclose(p);
    }
    snprintf(out, n, "%s%s", line, dirty ? "-dirty" : "");
}

void kvs_store_host_cpu(char *model, size_t n) {
    snprintf(model, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ') c++;
                    c[strcspn(c, "\r\n")] = '\0';
                    snprintf(model, n, "%s", c);
                }
                break;
            }
        }
        fclose(f);
    }
}

/* The CPU's vector and matrix features that change which kernels run (from
 * /proc/cpuinfo's flags), space-separated; "" when unknown. */
static void host_cpu_flags(char *out, size_t n) {
    static const char *const keep[] = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                                       "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
                                       "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve"};
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0 && strncmp(line, "Features", 8) != 0) continue;
        const char *c = strchr(line, ':');
        if (!c) break;
        size_t w = 0;
        for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
            const size_t kl = strlen(keep[i]);
            for (const char *p = c + 1; (p = strstr(p, keep[i])) != NULL; p += kl)
                if (p[-1] == ' ' && (p[kl] == ' ' || p[kl] == '\n' || p[kl] == '\0')) {
                    w += (size_t)snprintf(out + w, w < n ? n - w : 0, "%s%s", w ? " " : "", keep[i]);
                    break;
                }
        }
        break;
    }
    fclose(f);
}

/* "cpu: <model name> (<n> threads)". */
static void device_name(char *out, size_t n) {
    char model[256];
    kvs_store_host_cpu(model, sizeof model);
    snprintf(out, n, "cpu: %s (%ld threads)", model, sysconf(_SC_NPROCESSORS_ONLN));
}

/* Runs this host left 'running' whose process is gone become 'abandoned'. */
static void mark_abandoned(kvs_store *s, const char *host) {
    sqlite3_stmt *q = NULL, *u = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT id, pid FROM runs WHERE status='running' AND host=?", -1,
                           &q, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "UPDATE runs SET status='abandoned' WHERE id=? AND status='running'",
                           -1, &u, NULL) != SQLITE_OK)
        goto cleanup;
    sqlite3_bind_text(q, 1, host, -1, SQLITE_TRANSIENT);
    while (sqlite3_step(q) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(q, 0);
        pid_t pid = (pid_t)sqlite3_column_int64(q, 1);
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
            sqlite3_bind_int64(u, 1, id);
            sqlite3_step(u);
            sqlite3_reset(u);
        }
    }
cleanup:
    sqlite3_finalize(q);
    sqlite3_finalize(u);
}

kvs_status kvs_store_run_begin(kvs_store *s, const kvs_run_info *info, int64_t *run_id,
                               kvs_err *err) {
    char host[256] = "", dev[400], git[64], now[32], versions[768], flags[200];
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    device_name(dev, sizeof dev);
    git_revision(info->config_dir, git, sizeof git);
    iso_now(now, sizeof now);
    host_cpu_flags(flags, sizeof flags);
    snprintf(versions, sizeof versions,
             "{\"kvsieve\":\"%s\",\"sqlite\":\"%s\",\"lua\":\"%s\",\"cjson\":\"%s\",\"fftw\":\"%s\","
             "\"cpu_flags\":\"%s\"}",
             KVS_VERSION, sqlite3_libversion(), LUA_RELEASE, cJSON_Version(), fftwf_version, flags);
    mark_abandoned(s, host);

    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO runs(experiment, kind, config_path, config_text, config_hash,"
                           " overrides, git_rev, host, device, versions, kvsieve_version, started_at,"
                           " status, pid, n_cells, n_done) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,'running',?,?,0)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing run insert");
    sqlite3_bind_text(st, 1, info->experiment, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, info->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, info->config_path, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, info->config_text ? info->config_text : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, info->config_hash ? info->config_hash : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, info->overrides, -1, SQLITE_STATIC);
    if (git[0]) sqlite3_bind_text(st, 7, git, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, host, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, dev, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, versions, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 11, KVS_VERSION, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 12, now, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 13, (int64_t)getpid());
    sqlite3_bind_int64(st, 14, info->n_cells);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = db_fail(s, err, "inserting run");
    } else {
        *run_id = sqlite3_last_insert_rowid(s->db);
    }
    sqlite3_finalize(st);
    return rc;
}

kvs_status kvs_store_run_shard(kvs_store *s, int64_t run_id, const char *shard, kvs_err *err) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(s->db, "UPDATE runs SET shard=? WHERE id=?", -1, &st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing run shard update");
    sqlite3_bind_text(st, 1, shard, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, run_id);
    if (sqlite3_step(st) != SQLITE_DONE) rc = db_fail(s, err, "recording the run's shard");
    sqlite3_finalize(st);
    return rc;
}

kvs_status kvs_store_run_end(kvs_store *s, int64_t run_id, const char *status, int64_t n_done,
                             const char *error, kvs_err *err) {
    char now[32];
    iso_now(now, sizeof now);
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(s->db,
                           "UPDATE runs SET status=?, ended_at=?, n_done=?, error=? WHERE id=?", -1,
                           &st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing run update");
    sqlite3_bind_text(st, 1, status, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, now, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, n_done);
    sqlite3_bind_text(st, 4, error, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, run_id);
    if (sqlite3_step(st) != SQLITE_DONE) rc = db_fail(s, err, "updating run");
    sqlite3_finalize(st);
    return rc;
}

kvs_status kvs_store_run_account(kvs_store *s, int64_t run_id, const kvs_run_account *a,
                                 kvs_err *err) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(s->db,
                           "UPDATE runs SET wall_s=?, cpu_s=?, cpu_scope=?, requests=?, prefill_ms=?,"
                           " compress_ms=?, decode_ms=? WHERE id=?",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing run accounting update");
    sqlite3_bind_double(st, 1, a->wall_s);
    if (a->cpu_s >= 0)
        sqlite3_bind_double(st, 2, a->cpu_s);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_text(st, 3, a->cpu_scope ? a->cpu_scope : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, a->requests);
    sqlite3_bind_double(st, 5, a->prefill_ms);
    sqlite3_bind_double(st, 6, a->compress_ms);
    sqlite3_bind_double(st, 7, a->decode_ms);
    sqlite3_bind_int64(st, 8, run_id);
    if (sqlite3_step(st) != SQLITE_DONE)
        rc = db_fail(s, err, "recording the run's accounting");
    else if (sqlite3_changes(s->db) != 1)
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "%s: no run %lld to record accounting for", s->path,
                        (long long)run_id);
    sqlite3_finalize(st);
    return rc;
}

/* ---- writes -------------------------------------------------------------- */

static void bind_text_or_null(sqlite3_stmt *st, int i, const char *t) {
    if (t)
        sqlite3_bind_text(st, i, t, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

static int step_reset(sqlite3_stmt *st) {
    int r = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return r;
}

kvs_status kvs_store_put(kvs_store *s, int64_t run_id, const kvs_cell_row *cells,
                         const kvs_result_row *results, int n, kvs_err *err) {
    kvs_status rc = KVS_OK;
    if (n <= 0) return KVS_OK;
    if ((rc = exec(s, "BEGIN IMMEDIATE", err))) return rc;
    for (int i = 0; i < n; i++) {
        const kvs_cell_row *c = &cells[i];
        const kvs_result_row *r = &results[i];
        assert(c->key && c->experiment && c->kind && c->definition && c->method);
        sqlite3_stmt *st = s->ins_cell;
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, c->experiment, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, c->kind, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, c->definition, -1, SQLITE_STATIC);
        bind_text_or_null(st, 5, c->model);
        bind_text_or_null(st, 6, c->model_hash);
        sqlite3_bind_text(st, 7, c->dataset ? c->dataset : "", -1, SQLITE_STATIC);
        bind_text_or_null(st, 8, c->dataset_version);
        sqlite3_bind_text(st, 9, c->sample_id ? c->sample_id : "", -1, SQLITE_STATIC);
        bind_text_or_null(st, 10, c->shape);
        sqlite3_bind_int64(st, 11, c->n_tokens);
        sqlite3_bind_int64(st, 12, c->seed);
        sqlite3_bind_text(st, 13, c->method, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 14, c->label ? c->label : c->method, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 15, c->params_json ? c->params_json : "{}", -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 16, c->budget_ratio);
        sqlite3_bind_int64(st, 17, c->budget_tokens);
        bind_text_or_null(st, 18, c->prompt_hash);
        if (c->model_bytes > 0)
            sqlite3_bind_int64(st, 19, c->model_bytes);
        else
            sqlite3_bind_null(st, 19);
        if (step_reset(st) != SQLITE_DONE) {
            rc = db_fail(s, err, "inserting cell");
            goto rollback;
        }
        st = s->ins_result;
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        if (run_id > 0)
            sqlite3_bind_int64(st, 2, run_id);
        else
            sqlite3_bind_null(st, 2);
        bind_text_or_null(st, 3, r->prediction);
        sqlite3_bind_double(st, 4, r->prefill_ms);
        sqlite3_bind_double(st, 5, r->compress_ms);
        sqlite3_bind_double(st, 6, r->decode_ms);
        sqlite3_bind_int64(st, 7, r->decode_tokens);
        sqlite3_bind_int64(st, 8, r->kv_bytes_before);
        sqlite3_bind_int64(st, 9, r->kv_bytes_after);
        bind_text_or_null(st, 10, r->note && r->note[0] ? r->note : NULL);
        if (step_reset(st) != SQLITE_DONE) {
            rc = db_fail(s, err, "inserting result");
            goto rollback;
        }
        if (sqlite3_changes(s->db) == 0) continue; /* another writer finished it first */
        for (int j = 0; j < r->n_scores; j++) {
            st = s->ins_score;
            sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, r->scores[j].name, -1, SQLITE_STATIC);
            sqlite3_bind_double(st, 3, r->scores[j].value);
            if (step_reset(st) != SQLITE_DONE) {
                rc = db_fail(s, err, "inserting score");
                goto rollback;
            }
        }
    }
    return exec(s, "COMMIT", err);
rollback:
    exec(s, "ROLLBACK", NULL);
    return rc;
}

kvs_status kvs_store_is_done(kvs_store *s, const char *key, int *done, kvs_err *err) {
    sqlite3_bind_text(s->q_done, 1, key, -1, SQLITE_STATIC);
    int r = sqlite3_step(s->q_done);
    sqlite3_reset(s->q_done);
    sqlite3_clear_bindings(s->q_done);
    if (r != SQLITE_ROW && r != SQLITE_DONE) return db_fail(s, err, "reading results");
    *done = r == SQLITE_ROW;
    return KVS_OK;
}

kvs_status kvs_store_put_latency(kvs_store *s, int64_t run_id, const kvs_latency_row *rows, int n,
                                 kvs_err *err) {
    kvs_status rc = KVS_OK;
    if (n <= 0) return KVS_OK;
    if ((rc = exec(s, "BEGIN IMMEDIATE", err))) return rc;
    for (int i = 0; i < n; i++) {
        const kvs_latency_row *l = &rows[i];
        sqlite3_stmt *st = s->ins_latency;
        if (run_id > 0)
            sqlite3_bind_int64(st, 1, run_id);
        else
            sqlite3_bind_null(st, 1);
        bind_text_or_null(st, 2, l->cell_key);
        sqlite3_bind_text(st, 3, l->method, -1, SQLITE_STATIC);
        bind_text_or_null(st, 4, l->params_json);
        sqlite3_bind_text(st, 5, l->device ? l->device : "cpu", -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 6, l->shape ? l->shape : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 7, l->n_tokens);
        sqlite3_bind_text(st, 8, l->dtype ? l->dtype : "F32", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 9, l->repetitions);
        sqlite3_bind_double(st, 10, l->median_ms);
        sqlite3_bind_double(st, 11, l->p10_ms);
        sqlite3_bind_double(st, 12, l->p90_ms);
        sqlite3_bind_double(st, 13, l->bytes_moved);
        sqlite3_bind_double(st, 14, l->gbps);
        if (step_reset(st) != SQLITE_DONE) {
            rc = db_fail(s, err, "inserting latency row");
            exec(s, "ROLLBACK", NULL);
            return rc;
        }
    }
    return exec(s, "COMMIT", err);
}

/* NaN (an unknown percentile) is stored as NULL. */
static void bind_real_or_null(sqlite3_stmt *st, int i, double v) {
    if (isnan(v))
        sqlite3_bind_null(st, i);
    else
        sqlite3_bind_double(st, i, v);
}

kvs_status kvs_store_put_engine_bench(kvs_store *s, int64_t run_id, const kvs_engine_bench_row *r,
                                      int64_t *row_id, kvs_err *err) {
    assert(s && r);
    if (!r->model || !r->model_sha256 || !r->build_type)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: engine_bench row: model, model_sha256 and "
                          "build_type are required", s->path);
    if (r->prompt_len <= 0 || r->gen_tokens <= 0 || r->threads <= 0 || r->repetitions <= 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: engine_bench row: prompt_len %lld, gen_tokens "
                          "%lld, threads %lld, repetitions %lld must all be positive", s->path,
                          (long long)r->prompt_len, (long long)r->gen_tokens,
                          (long long)r->threads, (long long)r->repetitions);
    if (!(r->prefill_tok_s > 0) || !(r->decode_tok_s > 0))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: engine_bench row: median prefill %g and "
                          "decode %g tokens/s must be positive", s->path, r->prefill_tok_s,
                          r->decode_tok_s);
    char cpu[256];
    if (!r->host_cpu) kvs_store_host_cpu(cpu, sizeof cpu);
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO engine_bench(run_id, model, model_sha256, model_path, arch,"
                           " quant_types, device, prompt_len, gen_tokens, threads, repetitions,"
                           " prefill_tok_s, prefill_tok_s_p10, prefill_tok_s_p90, decode_tok_s,"
                           " decode_tok_s_p10, decode_tok_s_p90, prefill_cpu_tok_s, decode_cpu_tok_s,"
                           " load_avg_before, host_cpu, build_type, finished_at)"
                           " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                           "strftime('%Y-%m-%dT%H:%M:%SZ','now'))",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(s, err, "preparing engine_bench insert");
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_text(st, 2, r->model, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->model_sha256, -1, SQLITE_STATIC);
    bind_text_or_null(st, 4, r->model_path);
    bind_text_or_null(st, 5, r->arch);
    bind_text_or_null(st, 6, r->quant_types);
    sqlite3_bind_text(st, 7, r->device ? r->device : "cpu", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, r->prompt_len);
    sqlite3_bind_int64(st, 9, r->gen_tokens);
    sqlite3_bind_int64(st, 10, r->threads);
    sqlite3_bind_int64(st, 11, r->repetitions);
    sqlite3_bind_double(st, 12, r->prefill_tok_s);
    bind_real_or_null(st, 13, r->prefill_tok_s_p10);
    bind_real_or_null(st, 14, r->prefill_tok_s_p90);
    sqlite3_bind_double(st, 15, r->decode_tok_s);
    bind_real_or_null(st, 16, r->decode_tok_s_p10);
    bind_real_or_null(st, 17, r->decode_tok_s_p90);
    bind_real_or_null(st, 18, r->prefill_cpu_tok_s);
    bind_real_or_null(st, 19, r->decode_cpu_tok_s);
    if (r->load_avg_before >= 0)
        sqlite3_bind_double(st, 20, r->load_avg_before);
    else
        sqlite3_bind_null(st, 20);
    sqlite3_bind_text(st, 21, r->host_cpu ? r->host_cpu : cpu, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 22, r->build_type, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = db_fail(s, err, "inserting engine_bench row");
    } else if (row_id) {
        *row_id = sqlite3_last_insert_rowid(s->db);
    }
    sqlite3_finalize(st);
    return rc;
}
