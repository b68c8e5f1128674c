/* test_eval_report.c -- reports on a fixed database built here: Markdown,
 * LaTeX, CSV and JSON must match the golden files byte for byte (set
 * KVS_UPDATE_GOLDEN=1 to rewrite them after a deliberate change, then read
 * the diff); filters by experiment and run; plots through gnuplot; a clear
 * error when gnuplot is missing; decode_tok_s as total tokens / total time.
 * argv[1] is the golden folder. */
#include "eval_test_util.h"
#include "kvs_eval.h"
#include "test_util.h"

#include <sqlite3.h>

static char dir[64];

/* Two experiments: "demo" (fidelity, 3 variants x 2 budgets x 5 seeds, run 1)
 * and "lat" (latency rows only, run 2). Values are simple formulas. */
static void build_db(const char *db) {
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    sqlite3 *h = kvs_store_db(s);
    CHECK(sqlite3_exec(h,
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " git_rev, host, device, versions, kvsieve_version, started_at, ended_at,"
                       " status, pid, n_cells, n_done) VALUES"
                       "(1, 'demo', 'fidelity', 'demo.lua', 'experiment{}',"
                       " 'aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999', "
                       " '0123456789abcdef0123456789abcdef01234567', 'host', 'cpu: test', '{}', '0.1.0',"
                       " '2026-01-01T00:00:00Z', '2026-01-01T00:05:00Z', 'done', 1, 25, 25),"
                       "(2, 'lat', 'overhead', 'lat.lua', 'experiment{}', '99', NULL, 'host',"
                       " 'cpu: test', '{}', '0.1.0', '2026-01-02T00:00:00Z', NULL, 'interrupted', 2, 4, 3)",
                       NULL, NULL, NULL) == SQLITE_OK);
    const char *labels[3] = {"full", "snapkv window=8", "flashcache gamma=0.1"};
    const char *methods[3] = {"full", "snapkv", "flashcache"};
    double budgets[2] = {0.2, 0.5};
    for (int m = 0; m < 3; m++)
        for (int b = 0; b < (m == 0 ? 1 : 2); b++)
            for (int seed = 1; seed <= 5; seed++) {
                char key[64], sample[32];
                snprintf(key, sizeof key, "k-%d-%d-%d", m, b, seed);
                snprintf(sample, sizeof sample, "seed=%d", seed);
                double bud = m == 0 ? 1.0 : budgets[b];
                kvs_cell_row c = {.key = key, .experiment = "demo", .kind = "fidelity",
                                  .definition = key, .dataset = "synthetic", .sample_id = sample,
                                  .shape = "tiny", .n_tokens = 64, .seed = seed,
                                  .method = methods[m], .label = labels[m], .params_json = "{}",
                                  .budget_ratio = bud};
                double err_v = m == 0 ? 0.0 : (0.5 - 0.6 * bud) / m + 0.01 * seed;
                double ret = m == 0 ? 1.0 : 0.4 + 0.1 * m + 0.5 * bud + 0.02 * (seed % 3);
                kvs_score sc[4] = {{"mean_rel_err", err_v},
                                   {"retention", ret},
                                   {"kept_ratio", bud},
                                   {"compress_ms", 0.5 + m + 0.1 * seed}};
                kvs_result_row r = {.compress_ms = sc[3].value, .n_scores = 4, .scores = sc};
                CHECK_OK(kvs_store_put(s, 1, &c, &r, 1, &err), &err);
            }
    kvs_latency_row lat[4] = {
        {NULL, "snapkv", "{}", "cpu", "qwen2.5-vl-7b", "F32", 2048, 20, 2.5, 2.4, 2.7, 0, 0},
        {NULL, "snapkv", "{}", "cpu", "qwen2.5-vl-7b", "F32", 4096, 20, 5.0, 4.8, 5.5, 0, 0},
        {NULL, "flashcache", "{}", "cpu", "qwen2.5-vl-7b", "F32", 2048, 20, 1.6, 1.5, 1.8, 0, 0},
        {NULL, "flashcache", "{}", "cpu", "qwen2.5-vl-7b", "F32", 4096, 20, 3.9, 3.7, 4.1, 0, 0}};
    CHECK_OK(kvs_store_put_latency(s, 2, lat, 4, &err), &err);
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

static void golden(kvs_store *s, const char *gdir, const char *name, kvs_report_opts *o) {
    char out[256], gold[512];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    snprintf(gold, sizeof gold, "%s/%s", gdir, name);
    kvs_err err = {0};
    FILE *f = fopen(out, "w");
    CHECK(f != NULL);
    if (!f) return;
    CHECK_OK(kvs_report_write(s, o, f, &err), &err);
    fclose(f);
    char *got = slurp(out);
    const char *upd = getenv("KVS_UPDATE_GOLDEN");
    if (upd && *upd == '1') {
        FILE *g = fopen(gold, "w");
        if (g && got) fputs(got, g);
        if (g) fclose(g);
        printf("rewrote %s\n", gold);
    }
    char *want = slurp(gold);
    CHECK_MSG(got && want && !strcmp(got, want), "%s differs from %s (diff them)", out, gold);
    free(got);
    free(want);
}

/* decode_tok_s is total tokens / total decode time, not a mean of the
 * per-request rates: requests of 2 tokens in 10 ms (200 tok/s) and 18 in
 * 190 ms (94.7) give 20 / 0.2 s = 100 tok/s (the plain mean would be 147.4);
 * other metrics stay plain means. */
static void test_decode_rate(void) {
    char db[256];
    snprintf(db, sizeof db, "%s/rate.db", dir);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return;
    CHECK(sqlite3_exec(kvs_store_db(s),
                       "INSERT INTO runs(id, experiment, kind, config_path, config_text, config_hash,"
                       " git_rev, host, device, versions, kvsieve_version, started_at, ended_at,"
                       " status, pid, n_cells, n_done) VALUES"
                       "(1, 'rate', 'task', 'rate.lua', 'experiment{}', '11', NULL, 'host',"
                       " 'cpu: test', '{}', '0.1.0', '2026-01-01T00:00:00Z', NULL, 'done', 1, 2, 2)",
                       NULL, NULL, NULL) == SQLITE_OK);
    const double ms[2] = {10, 190};
    const int64_t tok[2] = {2, 18};
    for (int i = 0; i < 2; i++) {
        char key[32], sample[32];
        snprintf(key, sizeof key, "rate-%d", i);
        snprintf(sample, sizeof sample, "s%d", i);
        kvs_cell_row c = {.key = key, .experiment = "rate", .kind = "task", .definition = key,
                          .dataset = "niah", .sample_id = sample, .shape = "-", .n_tokens = 100,
                          .seed = i, .method = "full", .label = "full", .params_json = "{}",
                          .budget_ratio = 1.0};
        kvs_score sc[2] = {{"decode_tok_s", 1e3 * (double)tok[i] / ms[i]}, {"needle", i}};
        kvs_result_row r = {.decode_ms = ms[i], .decode_tokens = tok[i], .n_scores = 2, .scores = sc};
        CHECK_OK(kvs_store_put(s, 1, &c, &r, 1, &err), &err);
    }
    char out[256];
    snprintf(out, sizeof out, "%s/rate.csv", dir);
    FILE *f = fopen(out, "w");
    CHECK(f != NULL);
    if (f) {
        kvs_report_opts o = {NULL, 0, KVS_REPORT_CSV, 1000, 20260};
        CHECK_OK(kvs_report_write(s, &o, f, &err), &err);
        fclose(f);
    }
    char *got = slurp(out);
    CHECK_MSG(got && strstr(got, ",decode_tok_s,2,100,"), "decode_tok_s is not 100:\n%s",
              got ? got : "(none)");
    CHECK_MSG(got && strstr(got, ",needle,2,0.5,"), "needle is not a plain mean:\n%s",
              got ? got : "(none)");
    free(got);
    kvs_store_close(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_eval_report GOLDEN_DIR\n");
        return 2;
    }
    if (eval_tmpdir(dir, "report")) return 1;
    char db[256];
    snprintf(db, sizeof db, "%s/fixed.db", dir);
    build_db(db);
    kvs_store *s = NULL;
    kvs_err err = {0};
    CHECK_OK(kvs_store_open(db, &s, &err), &err);
    if (!s) return kvs_test_finish("test_eval_report");
    kvs_report_opts o = {NULL, 0, KVS_REPORT_MD, 1000, 20260};
    golden(s, argv[1], "report.md", &o);
    o.format = KVS_REPORT_LATEX;
    golden(s, argv[1], "report.tex", &o);
    o.format = KVS_REPORT_CSV;
    golden(s, argv[1], "report.csv", &o);
    o.format = KVS_REPORT_JSON;
    golden(s, argv[1], "report.json", &o);
    /* filters */
    o.format = KVS_REPORT_MD;
    o.experiment = "demo";
    golden(s, argv[1], "report-demo.md", &o);
    o.experiment = "nope";
    CHECK_FAILS(kvs_report_write(s, &o, stdout, &err), KVS_ERR_NOTFOUND, &err,
                "no results for experiment 'nope'");
    o.experiment = NULL;
    o.run_id = 7;
    CHECK_FAILS(kvs_report_write(s, &o, stdout, &err), KVS_ERR_NOTFOUND, &err,
                "no results written by run 7");
    o.run_id = 0;
    /* plots */
    char svg[256], png[256];
    snprintf(svg, sizeof svg, "%s/p.svg", dir);
    snprintf(png, sizeof png, "%s/p.png", dir);
    CHECK_FAILS(kvs_report_plot(s, &o, "x.pdf", &err), KVS_ERR_INVALID, &err, ".svg or .png");
    const char *path = getenv("PATH");
    char *saved = path ? strdup(path) : NULL;
    setenv("PATH", "/nonexistent", 1);
    CHECK_FAILS(kvs_report_plot(s, &o, svg, &err), KVS_ERR_UNSUPPORTED, &err,
                "gnuplot is not installed");
    if (saved) setenv("PATH", saved, 1);
    free(saved);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        CHECK_OK(kvs_report_plot(s, &o, svg, &err), &err);
        char *t = slurp(svg);
        CHECK(t && strstr(t, "<svg") && strstr(t, "flashcache gamma=0.1"));
        free(t);
        char over[256];
        snprintf(over, sizeof over, "%s/p-overhead.svg", dir);
        t = slurp(over);
        CHECK(t && strstr(t, "<svg") && strstr(t, "snapkv"));
        free(t);
        CHECK_OK(kvs_report_plot(s, &o, png, &err), &err);
        t = slurp(png);
        CHECK(t && !memcmp(t, "\x89PNG", 4));
        free(t);
    } else {
        printf("gnuplot not installed: plot output not checked\n");
    }
    kvs_store_close(s);
    test_decode_rate();
    eval_rmdir(dir);
    return kvs_test_finish("test_eval_report");
}
