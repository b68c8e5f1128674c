/*
 * store_merge.c -- `kvsieve merge OUT.db IN.db...`: the exact union of
 * results databases (the shards of a distributed run, or any runs of the
 * same experiments).
 *
 * What it is: a two-pass copy over SQLite ATTACH. Pass 1 reads every input
 * and compares each cell key it holds with what OUT and the inputs before
 * it hold (their values, timings left out): conflicts are listed before
 * anything is written. Pass 2 copies, one transaction per input: runs with
 * new ids (known runs recognised, so merging twice changes nothing), cells,
 * results remapped to the new run ids, scores, and the latency and
 * engine_bench rows of the copied runs. Columns are copied by name as
 * OUT's schema lists them, so a column added by a later migration travels
 * without a change here.
 * What it is not: no schema migration of the inputs (they are only read;
 * an input at another schema version is refused), no report.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "kvs_eval.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SRC "kvs_src" /* the schema name of the attached input */

typedef struct {
    sqlite3 *db;
    const char *out_path;
    const char *in_path; /* the input being read */
    kvs_merge_keep keep;
    FILE *log;
    kvs_merge_summary *sum;
    kvs_err *err;
} merge_ctx;

/* ---- small SQL helpers ------------------------------------------------------------ */

static kvs_status sql_fail(merge_ctx *m, const char *what) {
    return kvs_errorf(m->err, KVS_ERR_IO, "merge %s into %s: %s: %s", m->in_path ? m->in_path : "",
                      m->out_path, what, sqlite3_errmsg(m->db));
}

static kvs_status exec(merge_ctx *m, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(m->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        kvs_status rc = kvs_errorf(m->err, KVS_ERR_IO, "merge %s into %s: %.200s: %s",
                                   m->in_path ? m->in_path : "", m->out_path, sql, msg ? msg : "?");
        sqlite3_free(msg);
        return rc;
    }
    return KVS_OK;
}

static kvs_status prep(merge_ctx *m, const char *sql, sqlite3_stmt **st) {
    if (sqlite3_prepare_v2(m->db, sql, -1, st, NULL) != SQLITE_OK) return sql_fail(m, "preparing");
    return KVS_OK;
}

/* A growing text buffer; on allocation failure it stays as it was and
 * oom is set. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        va_end(ap2);
        b->oom = 1;
        return;
    }
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            va_end(ap2);
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap2);
    va_end(ap2);
    b->n += (size_t)k;
}

/* "a, b, c": the columns of schema.table, less `skip` (NULL: none). */
static kvs_status columns(merge_ctx *m, const char *schema, const char *table, const char *skip,
                          sbuf *out) {
    char sql[160];
    snprintf(sql, sizeof sql, "PRAGMA %s.table_info(%s)", schema, table);
    sqlite3_stmt *st = NULL;
    kvs_status rc = prep(m, sql, &st);
    if (rc) return rc;
    int n = 0, r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 1);
        if (skip && !strcmp(name, skip)) continue;
        sb_add(out, "%s%s", n++ ? ", " : "", name);
    }
    sqlite3_finalize(st);
    if (r != SQLITE_DONE) return sql_fail(m, "reading the schema");
    if (out->oom) return kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
    if (n == 0)
        return kvs_errorf(m->err, KVS_ERR_FORMAT, "merge: %s has no table %s",
                          strcmp(schema, "main") ? m->in_path : m->out_path, table);
    return KVS_OK;
}

/* ---- the values a cell's result is compared on --------------------------------------- */

/* Timings differ between two runs of one cell and are not its result. */
static int is_timing_metric(const char *name) {
    size_t n = strlen(name);
    return (n > 3 && !strcmp(name + n - 3, "_ms")) || (n > 6 && !strcmp(name + n - 6, "_tok_s"));
}

typedef struct {
    sqlite3_stmt *res, *scores; /* of one schema */
} vals_stmts;

static kvs_status vals_prepare(merge_ctx *m, const char *schema, vals_stmts *v) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT c.definition, r.prediction, r.decode_tokens, r.kv_bytes_before,"
             " r.kv_bytes_after, r.run_id FROM %s.results r JOIN %s.cells c ON c.key = r.cell_key"
             " WHERE r.cell_key = ?",
             schema, schema);
    kvs_status rc = prep(m, sql, &v->res);
    if (rc) return rc;
    snprintf(sql, sizeof sql, "SELECT metric, value FROM %s.scores WHERE cell_key = ? ORDER BY metric",
             schema);
    return prep(m, sql, &v->scores);
}

static void vals_finalize(vals_stmts *v) {
    sqlite3_finalize(v->res);
    sqlite3_finalize(v->scores);
    v->res = v->scores = NULL;
}

static void sb_value(sbuf *b, sqlite3_stmt *st, int col) {
    switch (sqlite3_column_type(st, col)) {
    case SQLITE_NULL: sb_add(b, "NULL"); break;
    case SQLITE_INTEGER: sb_add(b, "%lld", (long long)sqlite3_column_int64(st, col)); break;
    case SQLITE_FLOAT: sb_add(b, "%.17g", sqlite3_column_double(st, col)); break;
    default: {
        /* text: one line, so the values text stays "field\tvalue\n" */
        const unsigned char *t = sqlite3_column_text(st, col);
        sb_add(b, "\"");
        for (; t && *t; t++) {
            if (*t == '\n') sb_add(b, "\\n");
            else if (*t == '\t') sb_add(b, "\\t");
            else if (*t == '\\' || *t == '"') sb_add(b, "\\%c", *t);
            else sb_add(b, "%c", *t);
        }
        sb_add(b, "\"");
    }
    }
}

/* The canonical "field\tvalue\n" text of key's result in the schema of v;
 * *found = 0 when the schema has no result for key. *run gets its run id
 * (0: none). */
static kvs_status cell_values(merge_ctx *m, vals_stmts *v, const char *key, sbuf *out, int *found,
                              int64_t *run) {
    out->n = 0;
    if (out->s) out->s[0] = '\0';
    *found = 0;
    *run = 0;
    sqlite3_bind_text(v->res, 1, key, -1, SQLITE_STATIC);
    int r = sqlite3_step(v->res);
    if (r == SQLITE_ROW) {
        *found = 1;
        static const char *const names[] = {"definition", "prediction", "decode_tokens",
                                            "kv_bytes_before", "kv_bytes_after"};
        for (int c = 0; c < 5; c++) {
            sb_add(out, "%s\t", names[c]);
            sb_value(out, v->res, c);
            sb_add(out, "\n");
        }
        *run = sqlite3_column_int64(v->res, 5);
    }
    sqlite3_reset(v->res);
    sqlite3_clear_bindings(v->res);
    if (r != SQLITE_ROW && r != SQLITE_DONE) return sql_fail(m, "reading a result");
    if (!*found) return KVS_OK;
    sqlite3_bind_text(v->scores, 1, key, -1, SQLITE_STATIC);
    while ((r = sqlite3_step(v->scores)) == SQLITE_ROW) {
        const char *metric = (const char *)sqlite3_column_text(v->scores, 0);
        if (is_timing_metric(metric)) continue;
        sb_add(out, "score %s\t", metric);
        sb_value(out, v->scores, 1);
        sb_add(out, "\n");
    }
    sqlite3_reset(v->scores);
    sqlite3_clear_bindings(v->scores);
    if (r != SQLITE_DONE) return sql_fail(m, "reading scores");
    if (out->oom) return kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
    return KVS_OK;
}

/* The value of `field` in a values text, or "(none)". */
static void field_value(const char *vals, const char *field, size_t flen, char *out, size_t n) {
    snprintf(out, n, "(none)");
    for (const char *p = vals; p && *p;) {
        const char *tab = strchr(p, '\t'), *nl = strchr(p, '\n');
        if (!tab || !nl) return;
        if ((size_t)(tab - p) == flen && !strncmp(p, field, flen)) {
            int len = (int)(nl - tab - 1);
            if (len > 160)
                snprintf(out, n, "%.160s... (%d characters)", tab + 1, len);
            else
                snprintf(out, n, "%.*s", len, tab + 1);
            return;
        }
        p = nl + 1;
    }
}

/* List one conflict: every field whose values differ, with both sides. */
static void report_conflict(merge_ctx *m, const char *key, const char *label, const char *a,
                            const char *a_from, const char *b, const char *b_from) {
    if (!m->log) return;
    fprintf(m->log, "conflict: cell %s (%s)\n", key, label);
    const char *texts[2] = {a, b};
    for (int side = 0; side < 2; side++)
        for (const char *p = texts[side]; *p;) {
            const char *tab = strchr(p, '\t'), *nl = strchr(p, '\n');
            if (!tab || !nl) break;
            size_t flen = (size_t)(tab - p);
            char va[256], vb[256];
            field_value(a, p, flen, va, sizeof va);
            field_value(b, p, flen, vb, sizeof vb);
            int seen_in_a = side == 1 && strcmp(va, "(none)") != 0; /* listed in the first pass */
            if (strcmp(va, vb) != 0 && !seen_in_a)
                fprintf(m->log, "  %.*s: %s (%s) vs %s (%s)\n", (int)flen, p, va, a_from, vb,
                        b_from);
            p = nl + 1;
        }
}

/* "experiment 'x', label, sample s, budget b" of a cell in schema. */
static void cell_label(merge_ctx *m, const char *schema, const char *key, char *out, size_t n) {
    char sql[300];
    snprintf(sql, sizeof sql,
             "SELECT experiment, label, sample_id, budget_ratio, budget_tokens FROM %s.cells"
             " WHERE key = ?",
             schema);
    sqlite3_stmt *st = NULL;
    snprintf(out, n, "?");
    if (sqlite3_prepare_v2(m->db, sql, -1, &st, NULL) != SQLITE_OK) return;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        char bud[48];
        if (sqlite3_column_int64(st, 4) > 0)
            snprintf(bud, sizeof bud, "%lld tokens", (long long)sqlite3_column_int64(st, 4));
        else
            snprintf(bud, sizeof bud, "ratio %g", sqlite3_column_double(st, 3));
        snprintf(out, n, "experiment '%s', %s, sample %s, budget %s", sqlite3_column_text(st, 0),
                 sqlite3_column_text(st, 1), sqlite3_column_text(st, 2), bud);
    }
    sqlite3_finalize(st);
}

/* ---- inputs ------------------------------------------------------------------------- */

static kvs_status attach(merge_ctx *m, const char *path) {
    m->in_path = path;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return kvs_errorf(m->err, KVS_ERR_NOTFOUND, "merge: %s: no such database file", path);
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(path, a) && realpath(m->out_path, b) && !strcmp(a, b))
        return kvs_errorf(m->err, KVS_ERR_INVALID,
                          "merge: %s is the output database itself; give another OUT", path);
    sqlite3_stmt *st = NULL;
    kvs_status rc = prep(m, "ATTACH ?1 AS " SRC, &st);
    if (rc) return rc;
    sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
    int r = sqlite3_step(st);
    sqlite3_finalize(st);
    if (r != SQLITE_DONE)
        return sql_fail(m, "attaching the input (SQLite reads a WAL database through a -shm file "
                           "next to it: its folder must be writable; copy it elsewhere if not)");
    /* a kvsieve database at this version? */
    int v = -1;
    if (sqlite3_prepare_v2(m->db, "SELECT version FROM " SRC ".schema_version", -1, &st, NULL) ==
        SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (v != KVS_STORE_SCHEMA_VERSION) {
        exec(m, "DETACH " SRC);
        if (v < 0)
            return kvs_errorf(m->err, KVS_ERR_FORMAT,
                              "merge: %s is not a kvsieve results database (no schema_version)",
                              path);
        return kvs_errorf(m->err, KVS_ERR_UNSUPPORTED,
                          "merge: %s is at schema version %d, this kvsieve writes %d: %s", path, v,
                          KVS_STORE_SCHEMA_VERSION,
                          v < KVS_STORE_SCHEMA_VERSION
                              ? "migrate it first by opening it once (kvsieve report --db IN)"
                              : "merge it with the newer kvsieve that wrote it");
    }
    return KVS_OK;
}

static void detach(merge_ctx *m) {
    kvs_err e2 = {0};
    kvs_err *keep = m->err;
    m->err = &e2;
    exec(m, "DETACH " SRC);
    m->err = keep;
}

/* ---- pass 1: conflicts ----------------------------------------------------------------- */

static kvs_status check_input(merge_ctx *m, const char *path, vals_stmts *vout,
                              sqlite3_stmt *seen_get, sqlite3_stmt *seen_put) {
    kvs_status rc;
    vals_stmts vin = {0};
    sqlite3_stmt *keys = NULL, *running = NULL;
    sbuf a = {0}, b = {0};
    char from_in[1100];
    if ((rc = vals_prepare(m, SRC, &vin))) goto done;
    if ((rc = prep(m, "SELECT id, experiment FROM " SRC ".runs WHERE status = 'running'", &running)))
        goto done;
    while (m->log && sqlite3_step(running) == SQLITE_ROW)
        fprintf(m->log, "merge: note: %s: run %lld (experiment '%s') is still marked running; its "
                "finished cells are merged\n", path, (long long)sqlite3_column_int64(running, 0),
                sqlite3_column_text(running, 1));
    if ((rc = prep(m, "SELECT cell_key FROM " SRC ".results ORDER BY rowid", &keys))) goto done;
    int r;
    while ((r = sqlite3_step(keys)) == SQLITE_ROW) {
        const char *key = (const char *)sqlite3_column_text(keys, 0);
        int found = 0;
        int64_t run = 0;
        if ((rc = cell_values(m, &vin, key, &a, &found, &run))) goto done;
        snprintf(from_in, sizeof from_in, "%s run %lld", path, (long long)run);
        /* what the key holds so far: an earlier input (or OUT, remembered), else OUT */
        char pf[1100] = "";
        int have = 0, from_out = 0;
        sqlite3_bind_text(seen_get, 1, key, -1, SQLITE_STATIC);
        int sr = sqlite3_step(seen_get);
        if (sr == SQLITE_ROW) {
            b.n = 0;
            sb_add(&b, "%s", (const char *)sqlite3_column_text(seen_get, 0));
            snprintf(pf, sizeof pf, "%s", (const char *)sqlite3_column_text(seen_get, 1));
            have = 1;
        }
        sqlite3_reset(seen_get);
        sqlite3_clear_bindings(seen_get);
        if (sr != SQLITE_ROW && sr != SQLITE_DONE) {
            rc = sql_fail(m, "reading the merge's key table");
            goto done;
        }
        if (!have) {
            int64_t orun = 0;
            if ((rc = cell_values(m, vout, key, &b, &have, &orun))) goto done;
            if (have) snprintf(pf, sizeof pf, "%s run %lld", m->out_path, (long long)orun);
            from_out = have;
        }
        int conflict = have && strcmp(b.s, a.s) != 0;
        if (conflict) {
            m->sum->conflicts++;
            char label[400];
            cell_label(m, SRC, key, label, sizeof label);
            report_conflict(m, key, label, b.s, pf, a.s, from_in);
        }
        /* remember the value that stands after this input */
        const char *stand = !have || (conflict && m->keep == KVS_MERGE_KEEP_LAST) ? a.s
                            : from_out                                            ? b.s
                                                                                  : NULL;
        if (stand) {
            sqlite3_bind_text(seen_put, 1, key, -1, SQLITE_STATIC);
            sqlite3_bind_text(seen_put, 2, stand, -1, SQLITE_STATIC);
            sqlite3_bind_text(seen_put, 3, stand == a.s ? from_in : pf, -1, SQLITE_STATIC);
            int pr = sqlite3_step(seen_put);
            sqlite3_reset(seen_put);
            sqlite3_clear_bindings(seen_put);
            if (pr != SQLITE_DONE) {
                rc = sql_fail(m, "writing the merge's key table");
                goto done;
            }
        }
    }
    if (r != SQLITE_DONE) rc = sql_fail(m, "reading the input's results");
done:
    if (!rc && (a.oom || b.oom)) rc = kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
    sqlite3_finalize(keys);
    sqlite3_finalize(running);
    vals_finalize(&vin);
    free(a.s);
    free(b.s);
    return rc;
}

/* ---- pass 2: copy ---------------------------------------------------------------------- */

/* Runs: copy (new id, merged_from) or recognise; fills temp.kvs_merge_runs. */
static kvs_status copy_runs(merge_ctx *m, const char *path) {
    kvs_status rc;
    sbuf cols = {0}, sql = {0};
    sqlite3_stmt *list = NULL, *find = NULL, *ins = NULL, *map = NULL, *from = NULL;
    if ((rc = columns(m, "main", "runs", "id", &cols))) goto done;
    sb_add(&sql, "INSERT INTO main.runs(%s) SELECT %s FROM " SRC ".runs WHERE id = ?1", cols.s,
           cols.s);
    if (sql.oom) {
        rc = kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    char abs[PATH_MAX];
    const char *origin = realpath(path, abs) ? abs : path;
    if ((rc = exec(m, "DELETE FROM temp.kvs_merge_runs")) ||
        (rc = prep(m, "SELECT id, host, pid, started_at, experiment, kind, config_hash, merged_from"
                      " FROM " SRC ".runs ORDER BY id",
                   &list)) ||
        (rc = prep(m, "SELECT id FROM main.runs WHERE host IS ?1 AND pid IS ?2 AND started_at = ?3"
                      " AND experiment = ?4 AND kind = ?5 AND config_hash = ?6 ORDER BY id LIMIT 1",
                   &find)) ||
        (rc = prep(m, sql.s, &ins)) ||
        (rc = prep(m, "INSERT INTO temp.kvs_merge_runs(src_id, dst_id, copied) VALUES(?1, ?2, ?3)",
                   &map)) ||
        (rc = prep(m, "UPDATE main.runs SET merged_from = ?1 WHERE id = ?2", &from)))
        goto done;
    int r;
    while ((r = sqlite3_step(list)) == SQLITE_ROW) {
        int64_t sid = sqlite3_column_int64(list, 0), did = 0;
        for (int c = 1; c <= 6; c++) sqlite3_bind_value(find, c, sqlite3_column_value(list, c));
        int fr = sqlite3_step(find);
        if (fr == SQLITE_ROW) did = sqlite3_column_int64(find, 0);
        sqlite3_reset(find);
        sqlite3_clear_bindings(find);
        if (fr != SQLITE_ROW && fr != SQLITE_DONE) {
            rc = sql_fail(m, "looking up a run");
            goto done;
        }
        int copied = did == 0;
        if (copied) {
            sqlite3_bind_int64(ins, 1, sid);
            if (sqlite3_step(ins) != SQLITE_DONE) {
                rc = sql_fail(m, "copying a run");
                goto done;
            }
            sqlite3_reset(ins);
            did = sqlite3_last_insert_rowid(m->db);
            char mf[PATH_MAX + 32];
            const unsigned char *prev = sqlite3_column_text(list, 7);
            if (prev)
                snprintf(mf, sizeof mf, "%s", (const char *)prev);
            else
                snprintf(mf, sizeof mf, "%s#%lld", origin, (long long)sid);
            sqlite3_bind_text(from, 1, mf, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(from, 2, did);
            if (sqlite3_step(from) != SQLITE_DONE) {
                rc = sql_fail(m, "recording a run's origin");
                goto done;
            }
            sqlite3_reset(from);
            m->sum->runs_copied++;
        } else {
            m->sum->runs_known++;
        }
        sqlite3_bind_int64(map, 1, sid);
        sqlite3_bind_int64(map, 2, did);
        sqlite3_bind_int(map, 3, copied);
        if (sqlite3_step(map) != SQLITE_DONE) {
            rc = sql_fail(m, "mapping run ids");
            goto done;
        }
        sqlite3_reset(map);
    }
    if (r != SQLITE_DONE) rc = sql_fail(m, "reading the input's runs");
done:
    sqlite3_finalize(list);
    sqlite3_finalize(find);
    sqlite3_finalize(ins);
    sqlite3_finalize(map);
    sqlite3_finalize(from);
    free(cols.s);
    free(sql.s);
    return rc;
}

enum { ACT_NEW = 1, ACT_SAME = 2, ACT_KEEP_OLD = 3, ACT_REPLACE = 4 };

/* Decide per key of the input (temp.kvs_merge_keys). */
static kvs_status classify(merge_ctx *m, vals_stmts *vout) {
    kvs_status rc;
    vals_stmts vin = {0};
    sqlite3_stmt *keys = NULL, *put = NULL;
    sbuf a = {0}, b = {0};
    if ((rc = exec(m, "DELETE FROM temp.kvs_merge_keys")) || (rc = vals_prepare(m, SRC, &vin)) ||
        (rc = prep(m, "SELECT cell_key FROM " SRC ".results", &keys)) ||
        (rc = prep(m, "INSERT INTO temp.kvs_merge_keys(key, action) VALUES(?1, ?2)", &put)))
        goto done;
    int r;
    while ((r = sqlite3_step(keys)) == SQLITE_ROW) {
        const char *key = (const char *)sqlite3_column_text(keys, 0);
        int fa = 0, fb = 0;
        int64_t ra, rb;
        if ((rc = cell_values(m, &vin, key, &a, &fa, &ra)) ||
            (rc = cell_values(m, vout, key, &b, &fb, &rb)))
            goto done;
        int act = !fb ? ACT_NEW
                  : !strcmp(a.s, b.s) ? ACT_SAME
                  : m->keep == KVS_MERGE_KEEP_LAST ? ACT_REPLACE
                                                    : ACT_KEEP_OLD;
        if (act == ACT_KEEP_OLD && m->keep == KVS_MERGE_REFUSE) {
            /* pass 1 found no conflict: OUT changed since (another writer) */
            rc = kvs_errorf(m->err, KVS_ERR_INVALID,
                            "merge %s into %s: cell %s now differs from %s's (was it written "
                            "during the merge?); this input is not merged",
                            m->in_path, m->out_path, key, m->out_path);
            goto done;
        }
        if (act == ACT_NEW) m->sum->cells_copied++;
        if (act == ACT_SAME) m->sum->cells_same++;
        if (act == ACT_REPLACE) m->sum->replaced++;
        sqlite3_bind_text(put, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int(put, 2, act);
        if (sqlite3_step(put) != SQLITE_DONE) {
            rc = sql_fail(m, "writing the merge's key table");
            goto done;
        }
        sqlite3_reset(put);
        sqlite3_clear_bindings(put);
    }
    if (r != SQLITE_DONE) rc = sql_fail(m, "reading the input's results");
done:
    if (!rc && (a.oom || b.oom)) rc = kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
    sqlite3_finalize(keys);
    sqlite3_finalize(put);
    vals_finalize(&vin);
    free(a.s);
    free(b.s);
    return rc;
}

/* INSERT INTO main.T(cols) SELECT cols FROM src.T x WHERE where, with run_id
 * (when T has it) mapped to the new run ids; *n gets the rows inserted. */
static kvs_status copy_table(merge_ctx *m, const char *table, const char *skip, const char *verb,
                             const char *where, int64_t *n) {
    sbuf cols = {0}, sel = {0}, sql = {0};
    kvs_status rc = columns(m, "main", table, skip, &cols);
    if (rc) goto done;
    /* the select list: the same names, run_id replaced by its mapping */
    for (const char *p = cols.s; *p;) {
        const char *e = strstr(p, ", ");
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 6 && !strncmp(p, "run_id", 6))
            sb_add(&sel, "%s(SELECT dst_id FROM temp.kvs_merge_runs WHERE src_id = x.run_id)",
                   sel.n ? ", " : "");
        else
            sb_add(&sel, "%sx.%.*s", sel.n ? ", " : "", (int)len, p);
        p += len;
        if (e) p += 2;
    }
    sb_add(&sql, "%s INTO main.%s(%s) SELECT %s FROM " SRC ".%s x WHERE %s", verb, table, cols.s,
           sel.s ? sel.s : "", table, where);
    if (cols.oom || sel.oom || sql.oom) {
        rc = kvs_errorf(m->err, KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = exec(m, sql.s))) goto done;
    if (n) *n += sqlite3_changes(m->db);
done:
    free(cols.s);
    free(sel.s);
    free(sql.s);
    return rc;
}

static kvs_status merge_input(merge_ctx *m, const char *path, vals_stmts *vout) {
    kvs_status rc;
    if ((rc = exec(m, "BEGIN IMMEDIATE"))) return rc;
    if ((rc = copy_runs(m, path)) || (rc = classify(m, vout))) goto rollback;
    static const char *const keys_new = "(SELECT key FROM temp.kvs_merge_keys WHERE action IN (1, 4))";
    char where[400];
    /* replaced results go first (scores reference results) */
    if ((rc = exec(m, "DELETE FROM main.scores WHERE cell_key IN (SELECT key FROM "
                      "temp.kvs_merge_keys WHERE action = 4)")) ||
        (rc = exec(m, "DELETE FROM main.latency WHERE cell_key IN (SELECT key FROM "
                      "temp.kvs_merge_keys WHERE action = 4)")) ||
        (rc = exec(m, "DELETE FROM main.results WHERE cell_key IN (SELECT key FROM "
                      "temp.kvs_merge_keys WHERE action = 4)")))
        goto rollback;
    snprintf(where, sizeof where, "x.key IN %s", keys_new);
    if ((rc = copy_table(m, "cells", NULL, "INSERT OR REPLACE", where, NULL))) goto rollback;
    snprintf(where, sizeof where, "x.cell_key IN %s", keys_new);
    if ((rc = copy_table(m, "results", NULL, "INSERT", where, NULL)) ||
        (rc = copy_table(m, "scores", NULL, "INSERT", where, NULL)))
        goto rollback;
    /* rows of newly copied runs, less the latency rows of results left out */
    snprintf(where, sizeof where,
             "x.run_id IN (SELECT src_id FROM temp.kvs_merge_runs WHERE copied = 1) AND (x.cell_key "
             "IS NULL OR x.cell_key NOT IN (SELECT key FROM temp.kvs_merge_keys WHERE action IN "
             "(2, 3)))");
    if ((rc = copy_table(m, "latency", "id", "INSERT", where, &m->sum->latency_copied))) goto rollback;
    snprintf(where, sizeof where,
             "x.run_id IN (SELECT src_id FROM temp.kvs_merge_runs WHERE copied = 1)");
    if ((rc = copy_table(m, "engine_bench", "id", "INSERT", where, &m->sum->bench_copied)))
        goto rollback;
    return exec(m, "COMMIT");
rollback:
    exec(m, "ROLLBACK");
    return rc;
}

kvs_status kvs_store_merge(kvs_store *out, const char *const *inputs, int n_inputs,
                           kvs_merge_keep keep, FILE *log, kvs_merge_summary *sum, kvs_err *err) {
    memset(sum, 0, sizeof *sum);
    merge_ctx m = {kvs_store_db(out), kvs_store_path(out), NULL, keep, log, sum, err};
    vals_stmts vout = {0};
    sqlite3_stmt *seen_get = NULL, *seen_put = NULL;
    kvs_status rc;
    if (n_inputs < 1) return kvs_errorf(err, KVS_ERR_INVALID, "merge: no input databases");
    if ((rc = exec(&m, "CREATE TEMP TABLE IF NOT EXISTS kvs_merge_seen(key TEXT PRIMARY KEY,"
                       " vals TEXT NOT NULL, origin TEXT NOT NULL);"
                       "CREATE TEMP TABLE IF NOT EXISTS kvs_merge_runs(src_id INTEGER PRIMARY KEY,"
                       " dst_id INTEGER NOT NULL, copied INTEGER NOT NULL);"
                       "CREATE TEMP TABLE IF NOT EXISTS kvs_merge_keys(key TEXT PRIMARY KEY,"
                       " action INTEGER NOT NULL);"
                       "DELETE FROM temp.kvs_merge_seen;")) ||
        (rc = vals_prepare(&m, "main", &vout)) ||
        (rc = prep(&m, "SELECT vals, origin FROM temp.kvs_merge_seen WHERE key = ?1", &seen_get)) ||
        (rc = prep(&m, "INSERT OR REPLACE INTO temp.kvs_merge_seen(key, vals, origin) VALUES(?1,?2,?3)",
                   &seen_put)))
        goto done;
    /* pass 1: every conflict, before anything is written */
    for (int i = 0; i < n_inputs; i++) {
        if ((rc = attach(&m, inputs[i]))) goto done;
        rc = check_input(&m, inputs[i], &vout, seen_get, seen_put);
        detach(&m);
        if (rc) goto done;
    }
    if (sum->conflicts > 0 && keep == KVS_MERGE_REFUSE) {
        m.in_path = NULL;
        rc = kvs_errorf(err, KVS_ERR_INVALID,
                        "merge: %lld cell key(s) have different results in different databases "
                        "(listed above); nothing was merged into %s. Choose with --keep first|last, "
                        "or find out why they differ",
                        (long long)sum->conflicts, m.out_path);
        goto done;
    }
    /* pass 2: copy, one transaction per input */
    for (int i = 0; i < n_inputs; i++) {
        if ((rc = attach(&m, inputs[i]))) goto done;
        rc = merge_input(&m, inputs[i], &vout);
        detach(&m);
        if (rc) {
            kvs_err_prefix(err, "input %d of %d (the inputs before it are merged; merging again is "
                           "safe)", i + 1, n_inputs);
            goto done;
        }
    }
done:
    sqlite3_finalize(seen_get);
    sqlite3_finalize(seen_put);
    vals_finalize(&vout);
    return rc;
}
