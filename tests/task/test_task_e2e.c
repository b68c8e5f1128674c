/*
 * test_task_e2e.c -- the task kind end to end against the real backend:
 * `kvsieve serve` (argv[1]) started by the runner as the embedded backend
 * on a tiny random-weight GGUF (tests/backend/tiny_model.c), a needle grid
 * and a JSONL QA file, interrupted after a few cells and resumed; the
 * stored rows, scores and the head-to-head report; error paths (no kvsieve
 * binary, image samples, a URL nobody listens on, query-agnostic mode).
 * The tiny model answers nonsense: scores are checked for range, not value.
 */
#include <sqlite3.h>
#include <sys/stat.h>

#include "../eval/eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"
#include "backend/tiny_model.h"

static char dir[64];
static const char *bin;

static int64_t q_int(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    else
        fprintf(stderr, "query failed: %s: %s\n", sql, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return v;
}

static double q_dbl(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    double v = NAN;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void test_run_resume(const char *model) {
    char cfgp[256], jsonl[256], db[256], text[4096];
    eval_write(dir, "qa.jsonl",
               "{\"id\": \"q1\", \"context\": \"The cat sat on the mat.\", \"question\": \"Where?\","
               " \"answers\": [\"on the mat\"]}\n"
               "{\"id\": \"q2\", \"context\": \"A hat is on the cat.\", \"question\": \"What?\","
               " \"answers\": \"a hat\"}\n"
               "{\"id\": \"q3\", \"context\": \"dropped by limit\", \"question\": \"?\", \"answers\": \"x\"}\n",
               jsonl, sizeof jsonl);
    snprintf(text, sizeof text,
             "experiment {\n"
             "  name = \"needle\", kind = \"task\",\n"
             "  backend = { embedded = true, model = \"%s\", threads = 1 },\n"
             "  dataset = niah { lengths = { 64 }, depths = { 0.2, 0.8 }, per_cell = 2, seed = 3 },\n"
             "  methods = { \"full\", \"snapkv\", \"streamingllm\" },\n"
             "  budgets = { 0.5 },\n"
             "  metrics = { \"needle\", \"contains\" },\n"
             "  n_predict = 4,\n"
             "}\n"
             "experiment {\n"
             "  name = \"qa\", kind = \"task\",\n"
             "  backend = { embedded = true, model = \"%s\", threads = 1 },\n"
             "  dataset = jsonl { path = \"qa.jsonl\", limit = 2 },\n"
             "  methods = { \"full\", \"random\" },\n"
             "  budgets = { 0.3, 0.6 },\n"
             "  metrics = { \"contains\", \"rouge_l\" },\n"
             "  n_predict = 3,\n"
             "}\n",
             model, model);
    eval_write(dir, "task.lua", text, cfgp, sizeof cfgp);
    snprintf(db, sizeof db, "%s/r.db", dir);
    kvs_err err = {0};
    kvs_config cfg;
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    if (err.code) return;
    kvs_store *s = NULL;
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    o.kvsieve_bin = bin;
    o.max_cells = 5;
    kvs_run_summary sum;
    /* needle: 4 samples x (full + 2 x 1 budget) = 12 cells; qa: 2 x (1 + 2) = 6 */
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, 12);
    CHECK_EQ_INT(sum.n_done, 5);
    CHECK_EQ_INT(sum.interrupted, 1);
    o.max_cells = 0;
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_cells, 18);
    CHECK_EQ_INT(sum.n_already, 5);
    CHECK_EQ_INT(sum.n_done, 13);
    CHECK_EQ_INT(sum.interrupted, 0);
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_already, 18);
    CHECK_EQ_INT(sum.n_done, 0);

    sqlite3 *h = kvs_store_db(s);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results"), 18);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results WHERE prediction IS NULL"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE kind != 'task' OR model_hash NOT LIKE "
                          "'sha256:%' OR length(prompt_hash) != 64"),
                 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(DISTINCT sample_id) FROM cells WHERE experiment = 'qa'"), 2);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE experiment = 'needle' AND "
                          "dataset_version LIKE 'niah-1%' AND n_tokens > 64"),
                 12);
    /* every cell scored on its metrics and the head-to-head columns */
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric IN ('needle', 'contains') AND "
                          "value BETWEEN 0 AND 1 AND cell_key IN (SELECT key FROM cells WHERE "
                          "experiment = 'needle')"),
                 24);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'rouge_l' AND value BETWEEN 0 AND 1"), 6);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'prefill_ms' AND value > 0"), 18);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'kv_kept_mb' AND value > 0"), 18);
    /* full keeps every global byte (sliding-window layers only their window, so never more than
     * before); compressed variants fewer; decode produced tokens */
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                          "c.method = 'full' AND r.kv_bytes_after > r.kv_bytes_before"),
                 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                          "c.method != 'full' AND r.kv_bytes_after >= r.kv_bytes_before"),
                 0);
    CHECK(q_dbl(h, "SELECT min(prefill_ms) FROM results") > 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results WHERE decode_tokens < 1 OR decode_tokens > 4"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results WHERE note LIKE 'mode=query_aware template=%'"), 18);
    /* one prefill per (sample, run): the variants of a sample sent together
     * share prefill_ms (the sample cut by --limit was finished by the resume) */
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM (SELECT c.sample_id FROM cells c JOIN results r ON "
                          "r.cell_key = c.key WHERE c.experiment = 'needle' GROUP BY c.sample_id, "
                          "r.run_id HAVING count(DISTINCT r.prefill_ms) != 1)"),
                 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM (SELECT c.sample_id FROM cells c JOIN results r ON "
                          "r.cell_key = c.key WHERE c.experiment = 'needle' GROUP BY c.sample_id "
                          "HAVING count(DISTINCT r.prefill_ms) != 1)"),
                 1);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM runs WHERE kind = 'task' AND status = 'interrupted'"), 1);

    /* the report: score per method with CI and the task columns */
    char rp[256];
    snprintf(rp, sizeof rp, "%s/report.md", dir);
    FILE *f = fopen(rp, "w+");
    kvs_report_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.experiment = "needle";
    CHECK_OK(kvs_report_write(s, &ro, f, &err), &err);
    rewind(f);
    static char rep[65536];
    size_t n = fread(rep, 1, sizeof rep - 1, f);
    rep[n] = '\0';
    fclose(f);
    CHECK_MSG(strstr(rep, "| method | n | needle | Δ needle vs full | contains | answer_kept | kv_kept_mb | "
                          "compress_ms | prefill_ms | decode_tok_s |") != NULL,
              "%s", rep);
    CHECK(strstr(rep, "| snapkv | 4 |") != NULL);
    /* answer_kept_l<L> (one per layer) stay out of the table: answer_kept is their mean */
    CHECK(strstr(rep, "answer_kept_l") == NULL);
    kvs_store_close(s);
    kvs_config_free(&cfg);
}

static void test_errors(const char *model) {
    char cfgp[256], db[256], text[2048], js[256];
    kvs_err err = {0};
    kvs_config cfg;
    kvs_store *s = NULL;
    kvs_run_summary sum;
    kvs_run_opts o;
    memset(&o, 0, sizeof o);
    snprintf(db, sizeof db, "%s/e.db", dir);
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    /* embedded without the kvsieve binary */
    snprintf(text, sizeof text,
             "experiment { name = \"e\", kind = \"task\", backend = { embedded = true, model = \"%s\" },\n"
             "  dataset = niah { lengths = 64, depths = 0.5 }, methods = \"full\", budgets = 0.5,\n"
             "  metrics = \"needle\" }\n",
             model);
    eval_write(dir, "e.lua", text, cfgp, sizeof cfgp);
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    CHECK_FAILS(kvs_run_config(s, &cfg, &o, &sum, &err), KVS_ERR_UNSUPPORTED, &err,
                "needs the kvsieve binary");
    kvs_config_free(&cfg);
    /* images with a text-only backend: refused before anything starts (the
     * image exists: the loader reads it) */
    eval_write(dir, "a.jpg", "tiny image bytes", js, sizeof js);
    eval_write(dir, "mb.json",
               "{\"meta_data\": {\"task_instruction\": [\"Look.\"]}, \"data\": [{\"sample_id\": 1,"
               " \"task_instruction_id\": 0, \"task_instance\": {\"context\": \"{image#1} what?\","
               " \"images_path\": [\"a.jpg\"]}, \"response\": \"cat\"}]}",
               js, sizeof js);
    snprintf(text, sizeof text,
             "experiment { name = \"mb\", kind = \"task\", backend = { embedded = true, model = \"%s\" },\n"
             "  dataset = milebench { path = \"mb.json\" }, methods = \"full\", budgets = 0.5,\n"
             "  metrics = \"contains\" }\n",
             model);
    eval_write(dir, "mb.lua", text, cfgp, sizeof cfgp);
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    o.kvsieve_bin = bin;
    CHECK_FAILS(kvs_run_config(s, &cfg, &o, &sum, &err), KVS_ERR_UNSUPPORTED, &err, "text only");
    CHECK_MSG(strstr(err.msg, "image") != NULL, "%s", err.msg);
    kvs_config_free(&cfg);
    /* a missing dataset file */
    snprintf(text, sizeof text,
             "experiment { name = \"mf\", kind = \"task\", backend = { url = \"http://127.0.0.1:1\" },\n"
             "  dataset = longbench { path = \"nope.jsonl\" }, methods = \"full\", budgets = 0.5,\n"
             "  metrics = \"rouge_l\" }\n");
    eval_write(dir, "mf.lua", text, cfgp, sizeof cfgp);
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    CHECK_FAILS(kvs_run_config(s, &cfg, &o, &sum, &err), KVS_ERR_NOTFOUND, &err, "does not exist");
    kvs_config_free(&cfg);
    /* nobody listens at the URL */
    snprintf(text, sizeof text,
             "experiment { name = \"u\", kind = \"task\", backend = { url = \"http://127.0.0.1:1\" },\n"
             "  dataset = niah { lengths = 64, depths = 0.5 }, methods = \"full\", budgets = 0.5,\n"
             "  metrics = \"needle\" }\n");
    eval_write(dir, "u.lua", text, cfgp, sizeof cfgp);
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    CHECK_FAILS(kvs_run_config(s, &cfg, &o, &sum, &err), KVS_ERR_IO, &err,
                "asking the backend which model it serves");
    kvs_config_free(&cfg);
    /* query-agnostic: the server decodes a per-variant suffix (the question)
     * on the compressed cache */
    snprintf(text, sizeof text,
             "experiment { name = \"ag\", kind = \"task\", backend = { embedded = true, model = \"%s\","
             " threads = 1 },\n  dataset = niah { lengths = 64, depths = 0.5 }, methods = { \"full\", "
             "\"snapkv\" },\n  budgets = 0.5, metrics = \"needle\", mode = \"query_agnostic\", "
             "n_predict = 2 }\n",
             model);
    eval_write(dir, "ag.lua", text, cfgp, sizeof cfgp);
    CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
    kvs_err_clear(&err);
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
    CHECK_EQ_INT(sum.n_done, 2);
    CHECK_EQ_INT(q_int(kvs_store_db(s), "SELECT count(*) FROM cells WHERE label LIKE "
                                        "'%[query_agnostic]'"),
                 2);
    kvs_config_free(&cfg);
    kvs_store_close(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_task_e2e PATH/TO/kvsieve\n");
        return 2;
    }
    bin = argv[1];
    if (eval_tmpdir(dir, "task")) return 1;
    char model[128];
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    tiny_spec spec = tiny_default("gemma3");
    spec.n_ctx = 4096;
    spec.sliding_window = 64;
    kvs_err err = {0};
    CHECK_OK(tiny_write(&spec, model, &err), &err);
    double t0 = kvs_now_ms();
    test_run_resume(model);
    double t1 = kvs_now_ms();
    test_errors(model);
    fprintf(stderr, "task_e2e: run+resume %.0f ms, errors %.0f ms\n", t1 - t0, kvs_now_ms() - t1);
    if (!kvs_test_failures) eval_rmdir(dir);
    return kvs_test_finish("task_e2e");
}
