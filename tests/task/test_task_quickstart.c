/*
 * test_task_quickstart.c -- label "model": a 2-sample subset of
 * experiments/quickstart.lua on the real default model (Gemma 3 270M),
 * through `kvsieve run` (argv[1]) exactly as a user runs it: embedded
 * backend, every method at both budgets, the head-to-head table printed at
 * the end. Skips (exit 77, shown as skipped by CTest) when the default model
 * is not installed (scripts/install_model.sh).
 */
#include <sqlite3.h>

#include "../eval/eval_test_util.h"
#include "kvs_backend.h"
#include "kvs_eval.h"
#include "test_util.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_task_quickstart PATH/TO/kvsieve experiments/quickstart.lua\n");
        return 2;
    }
    char path[1024];
    kvs_err err = {0};
    if (kvs_model_resolve("default", path, sizeof path, &err) != KVS_OK) {
        printf("SKIP: the default model is not installed (bash scripts/install_model.sh): %s\n",
               err.msg);
        return 77;
    }
    char dir[64];
    if (eval_tmpdir(dir, "qs")) return 1;
    char cmd[4096], out[256], db[256];
    snprintf(out, sizeof out, "%s/out.md", dir);
    snprintf(db, sizeof db, "%s/qs.db", dir);
    /* two samples: one length, one depth, two per cell */
    snprintf(cmd, sizeof cmd,
             "'%s' run '%s' -D 'dataset.lengths={768}' -D 'dataset.depths={0.5}' "
             "-D dataset.per_cell=2 --db '%s' > '%s'",
             argv[1], argv[2], db, out);
    double t0 = kvs_now_ms();
    int rc = system(cmd);
    double ms = kvs_now_ms() - t0;
    CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
    FILE *f = fopen(out, "r");
    static char text[65536];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    static const char *const methods[] = {"full", "random", "streamingllm", "h2o",
                                          "snapkv", "lookm", "meda", "flashcache"};
    for (int i = 0; i < 8; i++) {
        char row[64];
        snprintf(row, sizeof row, "| %s | 2 |", methods[i]);
        CHECK_MSG(strstr(text, row) != NULL, "row '%s' missing in:\n%s", row, text);
    }
    CHECK_MSG(strstr(text, "### budget 0.2") && strstr(text, "### budget 0.5") &&
                  strstr(text, "Δ needle vs full") && strstr(text, "decode_tok_s") &&
                  strstr(text, "kv_kept_mb") && strstr(text, "compress_ms"),
              "%s", text);
    /* the default model finds a needle at 768 tokens with its full cache */
    sqlite3 *h = NULL;
    if (sqlite3_open(db, &h) == SQLITE_OK) {
        sqlite3_stmt *st = NULL;
        double full = -1;
        int cells = -1;
        if (sqlite3_prepare_v2(h, "SELECT avg(s.value) FROM scores s JOIN cells c ON c.key = "
                                  "s.cell_key WHERE c.method = 'full' AND s.metric = 'needle'",
                               -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            full = sqlite3_column_double(st, 0);
        sqlite3_finalize(st);
        if (sqlite3_prepare_v2(h, "SELECT count(*) FROM results", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            cells = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
        CHECK_EQ_INT(cells, 2 * 15);
        CHECK_MSG(full >= 0.5, "full needle score %.2f", full);
    }
    sqlite3_close(h);
    fprintf(stderr, "task_quickstart_model: %.1f s\n", ms / 1000);
    if (!kvs_test_failures) eval_rmdir(dir);
    return kvs_test_finish("task_quickstart_model");
}
