/* test_eval_board.c -- `kvsieve report --board` (kvs_report_board) on a
 * small database built here: its five files (scores.csv, summary.md,
 * leaderboard.svg, tasks.svg, provenance.json) must match the golden files
 * in golden/board/ byte for byte (KVS_UPDATE_GOLDEN=1 rewrites them after a
 * deliberate change; read the diff); the CSV's n and mean of one row must be
 * what the cells hold (worked out here from the same formula); an experiment
 * without RULER scores, or no experiment named, is refused with a message.
 * argv[1] is the golden folder. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sqlite3.h>

static char dir[64];

static const char *const methods[4] = {"full", "snapkv", "flashcache", "h2o"};
static const char *const tasks[2] = {"niah_single_1", "vt"};
static const double ratios[2] = {0.5, 0.25};

/* The score of a cell: NIAH 0/1, VT a share of 4 references. full scores
 * 1 but on one VT sample. */
static double score(int task, int sample, int method, int b, int mode) {
    if (method == 0) return task == 1 && sample == 2 ? 0.75 : 1.0;
    const int k = sample + 3 * method + 5 * b + 7 * mode;
    if (task == 0) return k % 4 != 0 ? 1.0 : 0.0;
    return (double)(k % 5) / 4.0;
}

static void build_db(const char *db) {
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    sqlite3 *h = kvs_store_db(s);
    CHECK(sqlite3_exec(h,
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " overrides, git_rev, host, device, versions, kvsieve_version, started_at,"
                       " ended_at, status, pid, n_cells, n_done) VALUES"
                       "(1, 'lb-tiny', 'task', 'experiments/leaderboard.lua', 'experiment{}',"
                       " 'aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999',"
                       " '-D dataset.n=4 -D dataset.tasks={\"niah_single_1\",\"vt\"}',"
                       " '0123456789abcdef0123456789abcdef01234567', 'host', 'cpu: test (2 threads)',"
                       " '{\"kvsieve\":\"0.1.0\",\"cpu_flags\":\"avx2 fma\"}', '0.1.0',"
                       " '2026-01-01T00:00:00Z', '2026-01-01T00:20:00Z', 'done', 1, 56, 56)",
                       NULL, NULL, NULL) == SQLITE_OK);
    /* two shards: run 1 (its accounting stored through the API) and run 2,
     * a shard merged in with its accounting columns (samples 2 and 3);
     * provenance.json sums them */
    CHECK_OK(kvs_store_run_shard(s, 1, "0/2", &err), &err);
    kvs_run_account acct = {.cells = 56, .requests = 8, .wall_s = 1210.25, .cpu_s = 2300.5,
                            .cpu_scope = "kvsieve run and its embedded kvsieve serve",
                            .prefill_ms = 8004.0, .compress_ms = 200.0, .decode_ms = 4000.0};
    CHECK_OK(kvs_store_run_account(s, 1, &acct, &err), &err);
    CHECK_FAILS(kvs_store_run_account(s, 99, &acct, &err), KVS_ERR_NOTFOUND, &err, "no run 99");
    CHECK(sqlite3_exec(h,
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " overrides, git_rev, host, device, versions, kvsieve_version, started_at,"
                       " ended_at, status, pid, n_cells, n_done, shard, merged_from, wall_s, cpu_s,"
                       " cpu_scope, requests, prefill_ms, compress_ms, decode_ms) VALUES"
                       "(2, 'lb-tiny', 'task', 'experiments/leaderboard.lua', 'experiment{}',"
                       " 'aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999',"
                       " '-D dataset.n=4 -D dataset.tasks={\"niah_single_1\",\"vt\"}',"
                       " '0123456789abcdef0123456789abcdef01234567', 'node2', 'cpu: test (2 threads)',"
                       " '{\"kvsieve\":\"0.1.0\",\"cpu_flags\":\"avx2 fma\"}', '0.1.0',"
                       " '2026-01-01T00:00:00Z', '2026-01-01T00:15:00Z', 'done', 7, 56, 56, '1/2',"
                       " 'shard-1.db#1', 905.5, 1700.0, 'kvsieve run and its embedded kvsieve serve',"
                       " 8, 8020.0, 200.0, 4000.0)",
                       NULL, NULL, NULL) == SQLITE_OK);
    for (int mode = 0; mode < 2; mode++)
        for (int t = 0; t < 2; t++)
            for (int smp = 0; smp < 4; smp++)
                for (int m = 0; m < 4; m++)
                    for (int b = 0; b < (m == 0 ? 1 : 2); b++) {
                        char key[64], sample[48], label[64];
                        snprintf(key, sizeof key, "k-%d-%d-%d-%d-%d", mode, t, smp, m, b);
                        snprintf(sample, sizeof sample, "%s-L4096-S%d", tasks[t], smp);
                        snprintf(label, sizeof label, "%s%s", methods[m], mode ? " [query_agnostic]" : "");
                        const double ratio = m == 0 ? 1.0 : ratios[b];
                        kvs_cell_row c = {.key = key, .experiment = "lb-tiny", .kind = "task",
                                          .definition = key, .model = "Tiny Model",
                                          .model_hash = "sha256:00112233445566778899aabbccddeeff",
                                          .dataset = "ruler", .dataset_version = "ruler-1+data:test",
                                          .sample_id = sample, .n_tokens = 4000, .method = methods[m],
                                          .label = label, .params_json = m == 1 ? "{\"window\":\"8\"}" : "{}",
                                          .budget_ratio = ratio};
                        const double x = score(t, smp, m, b, mode);
                        kvs_score sc[5] = {{"ruler", x},
                                           {tasks[t], x},
                                           {"kv_kept_mb", 10.0 * ratio},
                                           {"compress_ms", m == 0 ? 0.0 : 2.0 + m},
                                           {"decode_tok_s", 20.0 + m}};
                        kvs_result_row r = {.prediction = "x", .prefill_ms = 1000.0 + smp, .compress_ms = sc[3].value,
                                            .decode_ms = 500.0, .decode_tokens = 10, .n_scores = 5,
                                            .scores = sc};
                        CHECK_OK(kvs_store_put(s, smp < 2 ? 1 : 2, &c, &r, 1, &err), &err);
                    }
    /* an experiment of another kind: no ruler scores */
    kvs_cell_row c = {.key = "other", .experiment = "other", .kind = "task", .definition = "other",
                      .dataset = "niah", .sample_id = "s", .method = "full", .label = "full",
                      .params_json = "{}", .budget_ratio = 1.0};
    kvs_score sc[1] = {{"needle", 1.0}};
    kvs_result_row r = {.prediction = "x", .n_scores = 1, .scores = sc};
    CHECK_OK(kvs_store_put(s, 1, &c, &r, 1, &err), &err);
    kvs_store_close(s);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (t) t[n] = '\0';
    fclose(f);
    return t;
}

static void golden(const char *out_dir, const char *gdir, const char *name) {
    char out[256], gold[512];
    snprintf(out, sizeof out, "%s/%s", out_dir, name);
    snprintf(gold, sizeof gold, "%s/board/%s", gdir, name);
    char *got = slurp(out);
    CHECK_MSG(got != NULL, "%s was not written", out);
    const char *upd = getenv("KVS_UPDATE_GOLDEN");
    if (got && upd && *upd == '1') {
        FILE *g = fopen(gold, "w");
        if (g) fputs(got, g);
        if (g) fclose(g);
        printf("rewrote %s\n", gold);
    }
    char *want = slurp(gold);
    CHECK_MSG(got && want && !strcmp(got, want), "%s differs from %s (diff them)", out, gold);
    free(got);
    free(want);
}

/* scores.csv's average row of snapkv (query_agnostic) at 0.25: n = 8 and the
 * mean of the 8 cells' scores. */
static void check_csv_row(const char *out_dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/scores.csv", out_dir);
    char *csv = slurp(path);
    CHECK(csv != NULL);
    if (!csv) return;
    double want = 0;
    for (int t = 0; t < 2; t++)
        for (int smp = 0; smp < 4; smp++) want += score(t, smp, 1, 1, 1);
    want /= 8;
    const char *row = strstr(csv, ",snapkv,snapkv,\"{\"\"window\"\":\"\"8\"\"}\",query_agnostic,0.25,average,");
    CHECK_MSG(row != NULL, "no snapkv query_agnostic 0.25 average row in %s", path);
    if (row) {
        int n = 0;
        double mean = -1;
        row = strstr(row, "average,") + 8;
        CHECK(sscanf(row, "%d,%lf", &n, &mean) == 2);
        CHECK_EQ_INT(n, 8);
        CHECK_MSG(fabs(mean - want) < 1e-6, "mean %g, want %g", mean, want);
    }
    free(csv);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s GOLDEN_DIR\n", argv[0]);
        return 2;
    }
    if (eval_tmpdir(dir, "board")) return 1;
    char db[128], out[128];
    snprintf(db, sizeof db, "%s/b.db", dir);
    snprintf(out, sizeof out, "%s/out/lb-tiny", dir); /* two levels: both created */
    build_db(db);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    kvs_report_opts o = {.experiment = "lb-tiny", .bootstrap = 200, .seed = 7};
    CHECK_OK(kvs_report_board(s, &o, out, "A test board: 2 tasks x 4 samples.", &err), &err);
    static const char *const files[] = {"scores.csv", "summary.md", "leaderboard.svg", "tasks.svg",
                                        "provenance.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) golden(out, argv[1], files[i]);
    check_csv_row(out);

    /* refusals */
    kvs_report_opts none = {.bootstrap = 200, .seed = 7};
    err = (kvs_err){0};
    CHECK(kvs_report_board(s, &none, out, NULL, &err) == KVS_ERR_INVALID);
    CHECK(strstr(err.msg, "--experiment") != NULL);
    kvs_report_opts other = {.experiment = "other", .bootstrap = 200, .seed = 7};
    err = (kvs_err){0};
    CHECK(kvs_report_board(s, &other, out, NULL, &err) == KVS_ERR_INVALID);
    CHECK(strstr(err.msg, "no 'ruler' scores") != NULL);
    kvs_report_opts missing = {.experiment = "nope", .bootstrap = 200, .seed = 7};
    err = (kvs_err){0};
    CHECK(kvs_report_board(s, &missing, out, NULL, &err) == KVS_ERR_NOTFOUND);
    kvs_store_close(s);
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_board");
}
