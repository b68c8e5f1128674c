/*
 * test_task_ruler.c -- ruler{} end to end: the config helper (tasks by name
 * and as tables, setting, data, errors naming the field), then `kvsieve
 * serve` (argv[1]) on a tiny random-weight GGUF as the embedded backend:
 * prompts generated with the backend's own /tokenize (the stored n_tokens
 * is the server's count and fits the target), both settings, per-task
 * scores and prompt_tokens, the cell key's n_predict / stop, resume; and
 * niah{ setting } as the same field as mode.
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

static kvs_status load(const char *text, kvs_config *cfg, kvs_err *err) {
    char p[256];
    kvs_err_clear(err); /* the `if (!err.code)` after each load reads this call's outcome */
    eval_write(dir, "c.lua", text, p, sizeof p);
    return kvs_config_load(p, NULL, 0, cfg, err);
}

static void test_config(void) {
    kvs_err err = {0};
    kvs_config cfg;
    CHECK_OK(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                  "  dataset = ruler { lengths = { 1024, 4096 }, n = 3, seed = 5,\n"
                  "    tasks = { 'niah_single_1', { name = 'mk', task = 'niah', type_haystack = 'needle',\n"
                  "              type_needle_k = 'numbers', num_needle_v = 2 }, { name = 'vt', num_hops = 2 } },\n"
                  "    setting = { 'query_aware', 'query_agnostic' } },\n"
                  "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        const kvs_experiment *e = &cfg.experiments[0];
        CHECK(!strcmp(e->dataset, "ruler"));
        CHECK_EQ_INT(e->n_ruler_tasks, 3);
        CHECK_EQ_INT(e->n_lengths, 2);
        CHECK_EQ_INT(e->lengths[1], 4096);
        CHECK_EQ_INT(e->per_cell, 3);
        CHECK_EQ_INT(e->seeds[0], 5);
        CHECK_EQ_INT(e->n_modes, 2);
        CHECK_EQ_INT(e->modes[1], KVS_PROMPT_QUERY_AGNOSTIC);
        CHECK_EQ_INT(e->n_predict, 0); /* each task's own */
        CHECK(!strcmp(e->ruler_tasks[1].type_haystack, "needle") && e->ruler_tasks[1].num_needle_v == 2);
        CHECK(!strcmp(e->ruler_tasks[1].type_needle_k, "numbers"));
        CHECK(e->ruler_tasks[2].kind == KVS_RULER_VT && e->ruler_tasks[2].num_hops == 2);
        kvs_config_free(&cfg);
    }
    /* default: the 13 standard tasks; setting at the experiment */
    CHECK_OK(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                  "  dataset = ruler { lengths = 4096 }, setting = 'query_agnostic',\n"
                  "  methods = 'full', budgets = 0.5, metrics = 'ruler', n_predict = 16 }\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        CHECK_EQ_INT(cfg.experiments[0].n_ruler_tasks, 13);
        CHECK_EQ_INT(cfg.experiments[0].n_modes, 1);
        CHECK_EQ_INT(cfg.experiments[0].modes[0], KVS_PROMPT_QUERY_AGNOSTIC);
        CHECK_EQ_INT(cfg.experiments[0].seeds[0], 42);
        CHECK_EQ_INT(cfg.experiments[0].n_predict, 16);
        kvs_config_free(&cfg);
    }
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096 }, kv_spans = 'yes',\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "kv_spans");
    CHECK_OK(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                  "  dataset = ruler { lengths = 4096 }, kv_spans = false,\n"
                  "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        CHECK_EQ_INT(cfg.experiments[0].no_kv_spans, 1);
        kvs_config_free(&cfg);
    }
    /* niah{ haystack, setting } */
    CHECK_OK(load("experiment { name = 'n', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                  "  dataset = niah { lengths = 512, depths = 0.5, haystack = 'paul_graham', setting = 'query_agnostic' },\n"
                  "  methods = 'full', budgets = 0.5, metrics = 'needle' }\n",
                  &cfg, &err),
             &err);
    if (!err.code) {
        CHECK(!strcmp(cfg.experiments[0].haystack, "paul_graham"));
        CHECK_EQ_INT(cfg.experiments[0].modes[0], KVS_PROMPT_QUERY_AGNOSTIC);
        kvs_config_free(&cfg);
    }
    /* errors name the field */
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096, tasks = { 'niah_single_1', 'vtt' } },\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "dataset.tasks[2]");
    CHECK(strstr(err.msg, "did you mean 'vt'") != NULL);
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096, tasks = { { name = 'x', task = 'niah', type_needle_v = 'emoji' } } },\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "type_needle_v");
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096, tasks = { { name = 'x', task = 'niah', num_hopz = 2 } } },\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "num_hopz");
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096, setting = 'query_aware' }, mode = 'query_aware',\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "once");
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = ruler { lengths = 4096, setting = 'query_blind' },\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'ruler' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "setting");
    CHECK_FAILS(load("experiment { name = 'r', kind = 'task', backend = { url = 'http://127.0.0.1:1' },\n"
                     "  dataset = niah { lengths = 512, depths = 0.5, haystack = 'paul' },\n"
                     "  methods = 'full', budgets = 0.5, metrics = 'needle' }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "paul_graham");
    CHECK_FAILS(load("experiment { name = 'r', kind = 'fidelity',\n"
                     "  dataset = ruler { lengths = 4096 }, methods = 'full', budgets = 0.5 }\n",
                     &cfg, &err),
                KVS_ERR_INVALID, &err, "ruler{...} is for kind 'task'");
}

static void test_run(const char *model) {
    char text[2048], cfgp[256], db[256];
    /* tasks that need no data files; lengths in the tiny model's tokens */
    snprintf(text, sizeof text,
             "experiment {\n"
             "  name = 'ruler', kind = 'task',\n"
             "  backend = { embedded = true, model = '%s', threads = 1 },\n"
             "  dataset = ruler { lengths = { 1024 }, n = 2, seed = 1,\n"
             "    tasks = { 'niah_single_1', 'niah_multikey_2', 'vt', 'fwe' },\n"
             "    setting = { 'query_aware', 'query_agnostic' } },\n"
             "  methods = { 'full', 'streamingllm' },\n"
             "  budgets = { 0.5 },\n"
             "  metrics = { 'ruler' },\n"
             "  n_predict = 3,\n"
             "}\n",
             model);
    eval_write(dir, "ruler.lua", text, cfgp, sizeof cfgp);
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
    kvs_run_summary sum;
    /* 4 tasks x 2 samples x 2 settings x (full + 1) = 32 cells, in 8 requests (a sample's two settings
     * share one: the server takes compress_suffix) */
    FILE *pf = tmpfile();
    o.progress = pf;
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
    o.progress = NULL;
    char plog[8192] = "";
    if (pf) {
        rewind(pf);
        plog[fread(plog, 1, sizeof plog - 1, pf)] = 0;
        fclose(pf);
    }
    CHECK_MSG(strstr(plog, "backend URL(s), 8 requests"), "the run's requests: %.600s", plog);
    CHECK_EQ_INT(sum.n_cells, 32);
    CHECK_EQ_INT(sum.n_done, 32);
    CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err); /* resume: the same prompts, nothing to do */
    CHECK_EQ_INT(sum.n_already, 32);
    CHECK_EQ_INT(sum.n_done, 0);
    sqlite3 *h = kvs_store_db(s);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE dataset = 'ruler' AND dataset_version = "
                          "'ruler-1+data:none'"), 32);
    /* the stored n_tokens is the server's count of the prompt; query-aware
     * (the whole prompt) it is the generator's count, which fits 1024 minus
     * the task's tokens to generate (niah 128, vt 30, fwe 50) */
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells c JOIN results r ON r.cell_key = c.key JOIN scores s ON "
                          "s.cell_key = c.key AND s.metric = 'prompt_tokens' WHERE r.note LIKE 'mode=query_aware%' "
                          "AND c.n_tokens = s.value"), 16);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE n_tokens > 1024 - 128 AND sample_id LIKE 'niah%'"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE n_tokens > 1024 - 30"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'prompt_tokens' AND value BETWEEN 800 AND 1024"), 32);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'ruler' AND value BETWEEN 0 AND 1"), 32);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'niah_multikey_2'"), 8);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores s JOIN scores t ON s.cell_key = t.cell_key WHERE "
                          "s.metric = 'ruler' AND t.metric = 'vt' AND s.value = t.value"), 8);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE definition LIKE '%n_predict=3 stop=none%'"), 32);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results WHERE decode_tokens > 3"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM cells WHERE label LIKE '%[query_agnostic]'"), 16);
    /* answer spans: niah and vt samples sent kv_spans; this branch's server
     * may or may not answer them, and says which in the note or the scores */
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results r JOIN cells c ON c.key = r.cell_key WHERE "
                          "c.sample_id NOT LIKE 'fwe%' AND r.note NOT LIKE '%span_kept=absent%' AND "
                          "r.cell_key NOT IN (SELECT cell_key FROM scores WHERE metric = 'answer_kept')"), 0);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores WHERE metric = 'answer_kept' AND (value < 0 OR value > 1)"), 0);
    kvs_store_close(s);
    kvs_config_free(&cfg);
    /* Both settings went in one request per sample (compress_suffix); one setting per run sends today's
     * requests (the query-aware prompt whole): the same cells, predictions and scores */
    char db2[256];
    snprintf(db2, sizeof db2, "%s/r2.db", dir);
    CHECK_OK(kvs_store_open(db2, &s, &err), &err);
    for (int k = 0; k < 2 && s; k++) {
        const char *one = k ? "setting = { 'query_agnostic' }" : "setting = { 'query_aware' }";
        char t2[2048];
        const char *at = strstr(text, "setting = { 'query_aware', 'query_agnostic' }");
        snprintf(t2, sizeof t2, "%.*s%s%s", (int)(at - text), text, one, at + strlen("setting = { 'query_aware', 'query_agnostic' }"));
        eval_write(dir, "ruler1.lua", t2, cfgp, sizeof cfgp);
        CHECK_OK(kvs_config_load(cfgp, NULL, 0, &cfg, &err), &err);
        if (err.code) break;
        CHECK_OK(kvs_run_config(s, &cfg, &o, &sum, &err), &err);
        CHECK_EQ_INT(sum.n_done, 16);
        kvs_config_free(&cfg);
    }
    if (!s) return;
    h = kvs_store_db(s);
    char sql[512];
    snprintf(sql, sizeof sql, "ATTACH DATABASE '%s' AS one", db);
    CHECK(sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM results a JOIN one.results b ON a.cell_key = b.cell_key AND "
                          "a.prediction = b.prediction AND a.decode_tokens = b.decode_tokens AND "
                          "a.kv_bytes_after = b.kv_bytes_after"), 32);
    CHECK_EQ_INT(q_int(h, "SELECT count(*) FROM scores a JOIN one.scores b ON a.cell_key = b.cell_key AND "
                          "a.metric = b.metric AND a.value = b.value WHERE a.metric IN ('ruler', 'answer_kept')"),
                 q_int(h, "SELECT count(*) FROM one.scores WHERE metric IN ('ruler', 'answer_kept')"));
    kvs_store_close(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_task_ruler PATH/TO/kvsieve\n");
        return 2;
    }
    bin = argv[1];
    if (eval_tmpdir(dir, "ruler")) return 1;
    test_config();
    char model[128];
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    tiny_spec spec = tiny_default("llama");
    spec.n_ctx = 4096;
    kvs_err err = {0};
    CHECK_OK(tiny_write(&spec, model, &err), &err);
    double t0 = kvs_now_ms();
    test_run(model);
    fprintf(stderr, "task_ruler: run %.0f ms\n", kvs_now_ms() - t0);
    if (!kvs_test_failures) eval_rmdir(dir);
    return kvs_test_finish("task_ruler");
}
